// Writes through the CUDA API into watched device memory (issue #27): a CUPTI callback
// subscriber on the runtime and driver APIs' memcpy / memset entry points. memcheck does not
// hold copies and memsets through the CUDA API to NVTX permissions, so a PyTorch `copy_` into
// an alias of a marker (cudaMemcpyAsync) or a raw cudaMemsetAsync is invisible to it; here the
// call's destination range is compared with the watched ranges at the call's entry, on the
// calling thread, and a hit is handed to a Python callback (workbook.hooks.watch.apiwrites), which
// reads the Python stack and the watch's position at that moment.
// Built at run time by workbook.hooks.watch.apiwrites with the host's C++ compiler against CUPTI's
// headers; linked against the host's libcupti; loaded with ctypes.
//
// C ABI:
//   int  wcw_start(wcw_hit_fn fn)           subscribe + enable the memcpy/memset callbacks
//                                           (0 ok; else the CUptiResult; wcw_error() says why)
//   const char* wcw_error(void)             the last CUPTI error as text
//   void wcw_ranges(const uint64_t* lo, const uint64_t* hi, size_t n)   watched [lo, hi)
//   void wcw_suspend(int on)                1: no hits reported (the state's own writers run)
//   uint64_t wcw_calls(void)                memcpy/memset calls seen (all destinations)
//   void wcw_stop(void)                     unsubscribe
// The callback: fn(const char* call, uint64 dst, uint64 nbytes, uint64 src, int is_memset,
//                  uint64 value) — src is 0 for a memset, value 0 for a copy.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <vector>

#include <cupti.h>

typedef void (*wcw_hit_fn)(const char*, uint64_t, uint64_t, uint64_t, int, uint64_t);

static CUpti_SubscriberHandle g_sub = nullptr;
static wcw_hit_fn g_fn = nullptr;
static std::mutex g_mu;
static std::vector<uint64_t> g_lo, g_hi;
static std::atomic<int> g_suspended{0};
static std::atomic<uint64_t> g_calls{0};
static char g_err[256] = "";
static thread_local int t_in_runtime = 0;  // inside a runtime memcpy/memset: skip its driver twin

struct Req { uint64_t dst, n, src, value; int memset; };

static bool runtime_req(CUpti_CallbackId id, const void* p, Req* r) {
  r->src = 0; r->value = 0; r->memset = 0;
#define CPY(T) { auto* q = (const T*)p; r->dst = (uint64_t)q->dst; r->n = q->count; \
                 r->src = (uint64_t)q->src; return true; }
#define SET(T) { auto* q = (const T*)p; r->dst = (uint64_t)q->devPtr; r->n = q->count; \
                 r->value = (uint64_t)(unsigned)q->value; r->memset = 1; return true; }
  switch (id) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020: CPY(cudaMemcpy_v3020_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020: CPY(cudaMemcpyAsync_v3020_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000: CPY(cudaMemcpy_ptds_v7000_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000:
      CPY(cudaMemcpyAsync_ptsz_v7000_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020: SET(cudaMemset_v3020_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020: SET(cudaMemsetAsync_v3020_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000: SET(cudaMemset_ptds_v7000_params)
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000:
      SET(cudaMemsetAsync_ptsz_v7000_params)
    default: return false;
  }
#undef CPY
#undef SET
}

static bool driver_req(CUpti_CallbackId id, const void* p, Req* r) {
  r->src = 0; r->value = 0; r->memset = 0;
#define CPY(T, D, S) { auto* q = (const T*)p; r->dst = (uint64_t)q->D; r->n = q->ByteCount; \
                       r->src = (uint64_t)q->S; return true; }
#define SET(T, V, W) { auto* q = (const T*)p; r->dst = (uint64_t)q->dstDevice; \
                       r->n = q->N * (W); r->value = (uint64_t)q->V; r->memset = 1; return true; }
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy: CPY(cuMemcpy_params, dst, src)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync: CPY(cuMemcpyAsync_params, dst, src)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds: CPY(cuMemcpy_ptds_params, dst, src)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz: CPY(cuMemcpyAsync_ptsz_params, dst, src)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
      CPY(cuMemcpyHtoD_v2_params, dstDevice, srcHost)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
      CPY(cuMemcpyHtoDAsync_v2_params, dstDevice, srcHost)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
      CPY(cuMemcpyDtoD_v2_params, dstDevice, srcDevice)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
      CPY(cuMemcpyDtoDAsync_v2_params, dstDevice, srcDevice)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
      CPY(cuMemcpyHtoD_v2_ptds_params, dstDevice, srcHost)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
      CPY(cuMemcpyDtoD_v2_ptds_params, dstDevice, srcDevice)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz:
      CPY(cuMemcpyHtoDAsync_v2_ptsz_params, dstDevice, srcHost)
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz:
      CPY(cuMemcpyDtoDAsync_v2_ptsz_params, dstDevice, srcDevice)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2: SET(cuMemsetD8_v2_params, uc, 1)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2: SET(cuMemsetD16_v2_params, us, 2)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2: SET(cuMemsetD32_v2_params, ui, 4)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async: SET(cuMemsetD8Async_params, uc, 1)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async: SET(cuMemsetD16Async_params, us, 2)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async: SET(cuMemsetD32Async_params, ui, 4)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds: SET(cuMemsetD8_v2_ptds_params, uc, 1)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds: SET(cuMemsetD16_v2_ptds_params, us, 2)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds: SET(cuMemsetD32_v2_ptds_params, ui, 4)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz: SET(cuMemsetD8Async_ptsz_params, uc, 1)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz:
      SET(cuMemsetD16Async_ptsz_params, us, 2)
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz:
      SET(cuMemsetD32Async_ptsz_params, ui, 4)
    default: return false;
  }
#undef CPY
#undef SET
}

static bool overlaps(uint64_t lo, uint64_t hi) {
  std::lock_guard<std::mutex> g(g_mu);
  for (size_t i = 0; i < g_lo.size(); ++i)
    if (lo < g_hi[i] && g_lo[i] < hi) return true;
  return false;
}

static void CUPTIAPI on_call(void*, CUpti_CallbackDomain dom, CUpti_CallbackId id,
                             const void* data) {
  const CUpti_CallbackData* cb = (const CUpti_CallbackData*)data;
  Req r;
  bool rt = dom == CUPTI_CB_DOMAIN_RUNTIME_API;
  if (!(rt ? runtime_req(id, cb->functionParams, &r) : driver_req(id, cb->functionParams, &r)))
    return;
  if (rt) {
    if (cb->callbackSite == CUPTI_API_EXIT) { t_in_runtime = 0; return; }
    t_in_runtime = 1;
  } else if (cb->callbackSite != CUPTI_API_ENTER || t_in_runtime) {
    return;
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (g_suspended.load() || g_fn == nullptr || r.n == 0) return;
  if (!overlaps(r.dst, r.dst + r.n)) return;
  g_fn(cb->functionName ? cb->functionName : "?", r.dst, r.n, r.src, r.memset, r.value);
}

static int fail(CUptiResult rc, const char* what) {
  const char* s = nullptr;
  cuptiGetResultString(rc, &s);
  snprintf(g_err, sizeof g_err, "%s: %s", what, s ? s : "unknown CUPTI error");
  return (int)rc ? (int)rc : 1;
}

extern "C" const char* wcw_error(void) { return g_err; }

extern "C" int wcw_start(wcw_hit_fn fn) {
  g_fn = fn;
  if (g_sub != nullptr) return 0;
  CUptiResult rc = cuptiSubscribe(&g_sub, (CUpti_CallbackFunc)on_call, nullptr);
  if (rc != CUPTI_SUCCESS) { g_sub = nullptr; return fail(rc, "cuptiSubscribe"); }
  static const CUpti_CallbackId rt_ids[] = {
      CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000,
      CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000};
  static const CUpti_CallbackId drv_ids[] = {
      CUPTI_DRIVER_TRACE_CBID_cuMemcpy, CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2, CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz};
  for (CUpti_CallbackId id : rt_ids) {
    rc = cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API, id);
    if (rc != CUPTI_SUCCESS) return fail(rc, "cuptiEnableCallback (runtime API)");
  }
  for (CUpti_CallbackId id : drv_ids) {
    rc = cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
    if (rc != CUPTI_SUCCESS) return fail(rc, "cuptiEnableCallback (driver API)");
  }
  return 0;
}

extern "C" void wcw_ranges(const uint64_t* lo, const uint64_t* hi, size_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  g_lo.assign(lo, lo + n);
  g_hi.assign(hi, hi + n);
}

extern "C" void wcw_suspend(int on) { g_suspended.store(on); }

extern "C" uint64_t wcw_calls(void) { return g_calls.load(); }

extern "C" void wcw_stop(void) {
  if (g_sub != nullptr) {
    cuptiUnsubscribe(g_sub);
    g_sub = nullptr;
  }
  g_fn = nullptr;
}
