// NVTX memory permissions for compute-sanitizer (brief §9.2): the workbook marks the budget
// state's device tensors read-only process-wide, so memcheck reports every write to them, in
// bounds or not, by any kernel (PyTorch, Triton, FlashInfer's FFI, a raw cudaMemsetAsync).
// Built at run time by workbook.hooks.watch.protect with the host's g++ against the CUDA toolkit's
// nvtx3 headers; loaded with ctypes. NVTX v3 is header-only: outside compute-sanitizer (no
// injection library) every call is a no-op, so the shim is harmless in a plain run.
//
// C ABI (all pointers are device virtual addresses as integers):
//   int    wbp_init(void)                                   domain + process-wide permissions
//                                                           (0; 2: no tool attached)
//   void*  wbp_heap(uintptr_t base, size_t size)            a caching-allocator segment as a
//                                                           SUB_ALLOCATOR heap (NULL: refused)
//   int    wbp_regions(void* heap, const uintptr_t* ptrs, const size_t* sizes, size_t n)
//   int    wbp_assign(const uintptr_t* ptrs, size_t n, uint32_t flags)
//   uint32_t wbp_flag(int which)                            0 READ, 1 READ|WRITE|ATOMIC, 2 RESET
#include <stddef.h>
#include <stdint.h>
#include <vector>

#include <nvtx3/nvToolsExtMem.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

static nvtxDomainHandle_t g_domain = nullptr;
static nvtxMemPermissionsHandle_t g_perm = nullptr;

extern "C" int wbp_init(void) {
  // compute-sanitizer (2025.3) implements NVTX's memory extension but not nvtxDomainCreateA:
  // the domain is NULL (NVTX's default domain) under it too, so a NULL domain says nothing.
  // The permissions handle does: NULL or NVTX_MEM_PERMISSIONS_HANDLE_NO_TOOL without a tool
  // (every call below is then a no-op; this returns 2). Measured on the H200: bailing out on
  // the NULL domain left the handle NULL, and the tool refused every nvtxMemPermissionsAssign
  // ("One or more of the parameters is invalid"); with the handle fetched, "not writable".
  if (g_domain == nullptr) g_domain = nvtxDomainCreateA("workbook.protect");
  g_perm = nvtxMemCudaGetProcessWidePermissions(g_domain);
  // not NVTX_MEM_PERMISSIONS_HANDLE_NO_TOOL: CUDA 13.0's header spells it as a static_cast
  // from int to a pointer, which C++ rejects
  intptr_t h = reinterpret_cast<intptr_t>(g_perm);
  return (h == 0 || h == static_cast<intptr_t>(-1)) ? 2 : 0;
}

extern "C" uint32_t wbp_flag(int which) {
  switch (which) {
    case 0: return NVTX_MEM_PERMISSIONS_REGION_FLAGS_READ;
    case 1: return NVTX_MEM_PERMISSIONS_REGION_FLAGS_READ | NVTX_MEM_PERMISSIONS_REGION_FLAGS_WRITE |
                   NVTX_MEM_PERMISSIONS_REGION_FLAGS_ATOMIC;
    default: return NVTX_MEM_PERMISSIONS_REGION_FLAGS_RESET;
  }
}

extern "C" void* wbp_heap(uintptr_t base, size_t size) {
  if (g_perm == nullptr) wbp_init();
  nvtxMemVirtualRangeDesc_t range = {};
  range.ptr = reinterpret_cast<void const*>(base);
  range.size = size;
  nvtxMemHeapDesc_t desc = {};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof(range);
  desc.typeSpecificDesc = &range;
  return reinterpret_cast<void*>(nvtxMemHeapRegister(g_domain, &desc));
}

extern "C" int wbp_regions(void* heap, const uintptr_t* ptrs, const size_t* sizes, size_t n) {
  if (g_perm == nullptr) wbp_init();
  std::vector<nvtxMemVirtualRangeDesc_t> r(n);
  for (size_t i = 0; i < n; ++i) {
    r[i].ptr = reinterpret_cast<void const*>(ptrs[i]);
    r[i].size = sizes[i];
  }
  nvtxMemRegionsRegisterBatch_t b = {};
  b.extCompatID = NVTX_EXT_COMPATID_MEM;
  b.structSize = sizeof(b);
  b.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  b.heap = reinterpret_cast<nvtxMemHeapHandle_t>(heap);
  b.regionCount = n;
  b.regionDescElementSize = sizeof(nvtxMemVirtualRangeDesc_t);
  b.regionDescElements = r.data();
  b.regionHandleElementsOut = nullptr;  // referenced by pointer from here on
  nvtxMemRegionsRegister(g_domain, &b);
  return 0;
}

extern "C" int wbp_assign(const uintptr_t* ptrs, size_t n, uint32_t flags) {
  // one call per region: the tool refuses a whole batch when one region in it is not a live
  // allocation it knows, so a batch would lose every permission for one bad pointer; the
  // number of calls made is returned (the tool reports each refusal in its own log)
  if (g_perm == nullptr) wbp_init();
  size_t made = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ptrs[i] == 0) continue;
    nvtxMemPermissionsAssignRegionDesc_t r = {};
    r.flags = flags;
    r.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
    r.region.pointer = reinterpret_cast<void const*>(ptrs[i]);
    nvtxMemPermissionsAssignBatch_t b = {};
    b.extCompatID = NVTX_EXT_COMPATID_MEM;
    b.structSize = sizeof(b);
    b.permissions = g_perm;
    b.regionCount = 1;
    b.regionElementSize = sizeof(nvtxMemPermissionsAssignRegionDesc_t);
    b.regionElements = &r;
    nvtxMemPermissionsAssign(g_domain, &b);
    ++made;
  }
  return static_cast<int>(made);
}
