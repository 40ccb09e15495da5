"""The budget state's tensors made read-only, so that a write to them names its writer.

The watch (``workbook.hooks.watch``) sees *that* a marker changed and between which boundaries;
this module makes the write itself fail where it happens, so the writer's kernel and call stack
are named — even an in-bounds write that goes around PyTorch's dispatcher (a raw memset, a
Triton store, a library kernel launched through its own FFI). Two forms of one contract ("a
write to a protected marker names the writer's stack"):

- ``nvtx`` (GPU, under ``compute-sanitizer --tool memcheck``; brief §9.2): the shim
  ``workbook/native/nvtx_protect.cpp`` (built here with the host's C++ compiler against the
  CUDA toolkit's ``nvtx3`` headers, loaded with ctypes) assigns NVTX memory permissions
  process-wide: READ only. memcheck then reports "Invalid __global__ write … Access to 0x… is
  not writable" with the kernel and the host backtrace down to the Python frame
  (``workbook.run.writer.sanitizer`` parses it). Layouts:
  - caching allocator off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``): each tensor its own
    allocation; the permission is assigned on its pointer;
  - caching allocator on (the layout the bug happened in): the segment holding a protected
    tensor is registered as a SUB_ALLOCATOR heap and *every* block of it (active and free, from
    ``torch.cuda.memory_snapshot()``) as a region — a segment registered as a heap counts as a
    pool, and a write to an unregistered part of it is itself reported (brief §9.2). The blocks
    tile the segment, so tensors allocated later inside it land in registered ranges.
  Without compute-sanitizer every NVTX call is a no-op (the shim reports "no tool attached").
- ``page`` (the CPU twin that CI runs): the protected tensors are moved onto pages of their own
  (``mmap`` + ``torch.frombuffer``, values copied, the state's attributes re-pointed) and
  ``mprotect``'ed read-only; ``faulthandler`` writes the Python stack of the faulting thread to
  ``<out_dir>/fault.txt`` when a write raises SIGSEGV, and the process ends there through
  ``_exit(11)`` (``FAULT_EXIT``; no core file, no Python code in a signal handler). The caller (``workbook.run.writer.command``) runs such a pass in a child
  process and reads the named writer (``sanitizer.parse_fault``).

Protected: the three marker tensors (never legitimately written after construction) always;
the marker caches outside their legitimate writers: permissions are lifted around
``ThinkingBudgetState.apply`` / ``apply_staged_writes`` and restored after (their current
pointers re-read each time). In the ``page`` form the markers are lifted there too: Triton's
interpreter copies every tensor argument back onto itself after a kernel (a write of unchanged
bytes). The canaries of the watch (``nvtx`` only) are read-only throughout. Not protected: the
budget's device view — vLLM's UVA view of pinned host memory, not a device allocation that NVTX
permissions or a private page can cover; the watch compares its values.

Red zones (``nvtx``): the markers are first moved into padded buffers
(``workbook.hooks.watch.redzone``) and the permission is assigned on the padded buffer, so a write
running in from a neighbour faults in the guard bytes before the marker.

Processing order: ``requirements`` (before any engine: what is missing is named, the stage
skipped, the rest of the watch intact) → ``attach(watch, state)`` right after
``ThinkingBudgetState.__init__`` (page: tensors moved before the watch reads them) →
``lift`` / ``restore`` around the legitimate writers. The layout evidence (the protected blocks'
neighbours in their caching-allocator segment) is ``workbook.hooks.watch.layout``'s.

Deliberately not here: running compute-sanitizer and parsing its log (``workbook.run``), the
watch's value comparison (``workbook.hooks.watch``), reading the allocator's layout
(``workbook.hooks.watch.layout``).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import mmap
import os
import shutil
import subprocess
import sys
import sysconfig

from workbook.hooks.watch.layout import blocks, segment_of, segments
from workbook.vllm import startup
from workbook.vllm.patching import PatchSet

MODES = ("none", "auto", "nvtx", "page", "api")
SHIM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "native",
                    "nvtx_protect.cpp")
FAULT_FILE = "fault.txt"
FAULT_EXIT = (11, 7)  # exit status after a refused write: SIGSEGV's number (SIGBUS's)
LEGIT = ("apply", "apply_staged_writes")  # ThinkingBudgetState's own writers
MARKERS = tuple(n for n, r in startup.STATE_TENSORS.items() if r == "marker")
LIFTED = tuple(n for n, r in startup.STATE_TENSORS.items() if r == "marker cache")


API_BESIDE_SANITIZER = ("writes through the CUDA API: not watched in this pass (CUPTI cannot "
                        "subscribe beside compute-sanitizer: "
                        "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)")


class ProtectError(RuntimeError):
    """The protection cannot be set up (named in the message)."""


# ---- what the nvtx form needs on the host -----------------------------------------------------

def _cuda_roots() -> list[str]:
    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    return [r for r in roots if r and os.path.isdir(r)]


def find_sanitizer() -> str | None:
    p = os.environ.get("COMPUTE_SANITIZER")
    if p:
        return p if os.access(p, os.X_OK) else None
    for r in _cuda_roots():
        c = os.path.join(r, "bin", "compute-sanitizer")
        if os.access(c, os.X_OK):
            return c
    return shutil.which("compute-sanitizer")


def _include_dirs() -> list[str]:
    dirs = [os.environ.get("NVTX_INCLUDE", "")]
    for r in _cuda_roots():
        dirs += [os.path.join(r, "include")] + glob.glob(os.path.join(r, "targets", "*",
                                                                      "include"))
    site = sysconfig.get_paths().get("purelib", "")
    dirs += glob.glob(os.path.join(site, "nvidia", "*", "include")) + \
        glob.glob(os.path.join(site, "nvidia", "*", "*", "include"))
    return [d for d in dirs if d and os.path.isdir(d)]


def find_nvtx_include() -> str | None:
    return next((d for d in _include_dirs()
                 if os.path.exists(os.path.join(d, "nvtx3", "nvToolsExtMem.h")) and
                 os.path.exists(os.path.join(d, "nvtx3", "nvToolsExtMemCudaRt.h"))), None)


def find_cuda_include() -> str | None:
    return next((d for d in _include_dirs()
                 if os.path.exists(os.path.join(d, "cuda_runtime.h"))), None)


def find_compiler() -> str | None:
    c = os.environ.get("CXX")
    if c:
        return shutil.which(c) or (c if os.access(c, os.X_OK) else None)
    return shutil.which("g++") or shutil.which("c++")


def requirements(mode: str = "nvtx") -> dict:
    """What the ``mode`` needs and whether it is there: ``{"ok", "missing": [...], "found",
    "message"}`` (the message names each missing piece and says the stage is skipped)."""
    if mode == "api":  # CUPTI alone (no memcheck): writes through the CUDA API
        from workbook.hooks.watch import apiwrites

        return apiwrites.requirements("cuda")
    if mode == "page":
        ok = hasattr(mmap, "mmap") and sys.platform.startswith("linux")
        return {"ok": ok, "missing": [] if ok else ["Linux mmap/mprotect"], "found": {},
                "message": None if ok else "the page twin needs Linux mmap/mprotect: skipped"}
    found = {"compute-sanitizer": find_sanitizer(), "NVTX headers": find_nvtx_include(),
             "CUDA runtime headers": find_cuda_include(), "C++ compiler": find_compiler()}
    hints = {"compute-sanitizer": "set COMPUTE_SANITIZER or install the CUDA toolkit",
             "NVTX headers": "nvtx3/nvToolsExtMem.h: set NVTX_INCLUDE or CUDA_HOME",
             "CUDA runtime headers": "cuda_runtime.h: set CUDA_HOME",
             "C++ compiler": "set CXX or install g++"}
    missing = [k for k, v in found.items() if not v]
    msg = None if not missing else (
        "sanitizer stage skipped: missing " + "; ".join(f"{k} ({hints[k]})" for k in missing) +
        ". The rest of the watch runs as without --sanitize.")
    return {"ok": not missing, "missing": missing, "found": found, "message": msg}


def resolve_mode(mode: str, platform: str) -> str:
    if mode not in MODES:
        raise ProtectError(f"protect={mode!r}: choose one of {MODES}")
    if mode == "auto":
        return "nvtx" if platform == "cuda" else "page"
    return mode


# ---- the NVTX shim -----------------------------------------------------------------------------

def build_shim(cache_dir: str | None = None) -> str:
    """Compile ``nvtx_protect.cpp`` (cached by source and flags); returns the library path."""
    req = requirements("nvtx")
    cxx, nvtx, cuda = (req["found"][k] for k in ("C++ compiler", "NVTX headers",
                                                  "CUDA runtime headers"))
    if not (cxx and nvtx and cuda):
        raise ProtectError(req["message"] or "the NVTX shim cannot be built")
    with open(SHIM, "rb") as f:
        src = f.read()
    flags = ["-O2", "-shared", "-fPIC", f"-I{nvtx}", f"-I{cuda}"]
    key = hashlib.sha256(src + " ".join([cxx] + flags).encode()).hexdigest()[:16]
    cache_dir = cache_dir or os.path.join(os.environ.get("WORKBOOK_CACHE", "/tmp/workbook-cache"),
                                          "native")
    os.makedirs(cache_dir, exist_ok=True)
    out = os.path.join(cache_dir, f"nvtx_protect-{key}.so")
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        p = subprocess.run([cxx, *flags, SHIM, "-o", tmp, "-ldl"], capture_output=True,
                           text=True)
        if p.returncode != 0:
            raise ProtectError(f"building the NVTX shim failed ({cxx}): {p.stderr[-1500:]}")
        os.replace(tmp, out)
    return out


def load_shim(path: str):
    lib = ctypes.CDLL(path)
    lib.wbp_init.restype = ctypes.c_int
    lib.wbp_flag.restype = ctypes.c_uint32
    lib.wbp_flag.argtypes = [ctypes.c_int]
    lib.wbp_heap.restype = ctypes.c_void_p
    lib.wbp_heap.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    lib.wbp_regions.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
    lib.wbp_assign.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                               ctypes.c_uint32]
    return lib


def _arr(vals):
    return (ctypes.c_size_t * len(vals))(*vals)


# ---- the two forms --------------------------------------------------------------------------------

class _Base:
    mode = "none"

    def __init__(self, state, out_dir: str | None):
        self.state = state
        self.out_dir = out_dir
        self.protected: list[str] = []
        self.notes: list[str] = []
        self.lifts = 0
        self.error: str | None = None
        self.api = None  # its apiwrites.ApiWatch (GPU: writes through the CUDA API)
        self.api_status: dict = {"on": False, "message": "not asked for"}

    def _named_ptrs(self, names) -> list[dict]:
        out = []
        for n in names:
            t = startup.resolve_path(self.state, n)
            if t is not None and hasattr(t, "data_ptr") and t.numel():
                out.append({"name": n, "ptr": t.data_ptr(), "nbytes": t.numel() * t.element_size()})
        return out

    def api_ranges(self, lifted: bool = True) -> None:
        """Hand the watched ranges (markers, canaries, marker caches) to the CUPTI subscriber."""
        if self.api is None:
            return
        canaries = getattr(self, "canaries", None) or {}
        rows = self._named_ptrs(MARKERS + (LIFTED if lifted else ())) + [
            {"name": n, "ptr": t.data_ptr(), "nbytes": t.numel() * t.element_size()}
            for n, t in canaries.items()]
        self.api.set_ranges(rows)

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "protected": list(self.protected), "lifts": self.lifts,
               "notes": list(self.notes), "error": self.error,
               "api_writes": {**self.api_status}}
        if self.api is not None:
            d = self.api.to_dict()
            out["api_writes"].update(calls_seen=d["calls_seen"], hits=len(d["records"]),
                                     suspensions=d["suspensions"], error=d["error"])
        return out


class PageGuard(_Base):
    """The CPU twin: protected tensors on read-only pages of their own."""

    mode = "page"
    PROT_READ, PROT_WRITE = 1, 2

    def __init__(self, state, out_dir: str | None):
        super().__init__(state, out_dir)
        self.pages: list[tuple[mmap.mmap, int, int]] = []  # (map, address, length)
        self.tensors: dict = {}
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._fault = None

    def attach(self, names=MARKERS + ("cached_last_start", "cached_last_end")) -> None:
        import torch

        for name in names:
            t = getattr(self.state, name, None)
            if t is None or t.device.type != "cpu":
                self.notes.append(f"{name}: not a CPU tensor, not moved")
                continue
            nbytes = t.numel() * t.element_size()
            length = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            m = mmap.mmap(-1, length, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            new = torch.frombuffer(m, dtype=t.dtype, count=t.numel()).view(t.shape)
            with torch.inference_mode():
                new.copy_(t)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            setattr(self.state, name, new)
            self.pages.append((m, addr, length))
            self.tensors[name] = new
            self.protected.append(name)
        self.notes.append("thinking_token_budget.gpu: vLLM's UVA view of pinned host memory, "
                          "not moved (the watch compares its values)")
        self._arm_fault_file()
        self.restore()

    def _arm_fault_file(self) -> None:
        """SIGSEGV / SIGBUS: ``faulthandler`` writes the Python stacks to ``fault.txt``, then
        re-raises into the handler installed under it — libc's ``_exit(signum)`` itself — so
        the process ends at once with exit status 11 (7), no core file, no Python code run in
        a signal handler."""
        import faulthandler
        import signal

        if not self.out_dir:
            return
        os.makedirs(self.out_dir, exist_ok=True)
        exit_fn = ctypes.cast(self._libc._exit, ctypes.c_void_p)
        self._libc.signal.restype = ctypes.c_void_p
        self._libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        for sig in (signal.SIGSEGV, signal.SIGBUS):
            self._libc.signal(int(sig), exit_fn)
        if faulthandler.is_enabled():
            faulthandler.disable()  # re-enabled below, chaining to _exit
        self._fault = open(os.path.join(self.out_dir, FAULT_FILE), "w")
        faulthandler.enable(file=self._fault, all_threads=True)

    def _prot(self, prot: int) -> None:
        for _m, addr, length in self.pages:
            if self._libc.mprotect(addr, length, prot) != 0:
                self.error = f"mprotect failed: errno {ctypes.get_errno()}"

    def lift(self) -> None:
        self.lifts += 1
        self._prot(self.PROT_READ | self.PROT_WRITE)

    def restore(self) -> None:
        self._prot(self.PROT_READ)

    def release(self) -> None:
        self._prot(self.PROT_READ | self.PROT_WRITE)


class NvtxGuard(_Base):
    """The GPU form: NVTX memory permissions, read-only process-wide."""

    mode = "nvtx"

    def __init__(self, state, out_dir: str | None, lib, canaries: dict, zones=None):
        super().__init__(state, out_dir)
        self.lib = lib
        self.canaries = canaries
        self.zones = zones  # workbook.hooks.watch.redzone.RedZones: markers in padded buffers
        self.attached = lib.wbp_init()  # 0: a tool (compute-sanitizer) is attached
        self.READ, self.RW, self.RESET = (lib.wbp_flag(i) for i in range(3))
        self.heaps: dict[int, dict] = {}
        self._lifted: list[int] = []
        self.caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"

    def _ptrs(self, names) -> list[int]:
        out = []
        for n in names:
            t = startup.resolve_path(self.state, n)
            if t is not None and hasattr(t, "data_ptr") and t.numel():
                out.append(t.data_ptr())
        return out

    def _marker_regions(self) -> list[int]:
        """The markers' regions: a padded buffer's address where the marker has red zones
        (the permission covers the red zones and the marker), else the marker's own."""
        zoned = self.zones.bases() if self.zones is not None else {}
        return [zoned[n] for n in MARKERS if n in zoned] + \
            self._ptrs([n for n in MARKERS if n not in zoned])

    def attach(self) -> None:
        if self.attached != 0:
            self.notes.append("no NVTX tool attached (not under compute-sanitizer): the "
                              "permission calls are no-ops")
        self.notes.append("thinking_token_budget.gpu: vLLM's UVA view of pinned host memory, "
                          "not a device allocation: not protected (the watch compares it)")
        fixed = self._marker_regions() + [t.data_ptr() for t in self.canaries.values()]
        if self.zones is not None and self.zones.zones:
            self.notes.append(f"red zones: {self.zones.size} bytes read-only before and after "
                              f"{', '.join(self.zones.zones)} (padded buffers)")
        if self.caching:
            self._register_segments(fixed + self._ptrs(LIFTED))
        self.lib.wbp_assign(_arr(fixed), len(fixed), self.READ)
        self.protected = list(MARKERS) + list(self.canaries) + list(LIFTED)
        self.restore()

    def _register_segments(self, ptrs) -> None:
        segs = segments()
        for p in ptrs:
            seg = segment_of(p, segs)
            if seg is None or seg["address"] in self.heaps:
                continue
            heap = self.lib.wbp_heap(seg["address"], seg["total_size"])
            bl = blocks(seg)
            self.lib.wbp_regions(heap, _arr([b["address"] for b in bl]),
                                 _arr([b["size"] for b in bl]), len(bl))
            self.heaps[seg["address"]] = {"segment": hex(seg["address"]),
                                          "size": seg["total_size"], "regions": len(bl),
                                          "heap": bool(heap)}
        if self.heaps:
            self.notes.append(f"caching allocator on: {len(self.heaps)} segment(s) registered "
                              "as SUB_ALLOCATOR heaps, every block a region")

    def lift(self) -> None:
        self.lifts += 1
        if self.api is not None:
            self.api.suspend()
        if self._lifted:
            self.lib.wbp_assign(_arr(self._lifted), len(self._lifted), self.RW)

    def restore(self) -> None:
        ptrs = self._ptrs(LIFTED)  # their current pointers
        new = [p for p in ptrs if p not in self._lifted]
        if new and self.caching:
            self._register_segments(new)
        self._lifted = ptrs
        self.lib.wbp_assign(_arr(ptrs), len(ptrs), self.READ)
        if self.api is not None:
            self.api_ranges()
            self.api.resume()

    def release(self) -> None:
        ptrs = self._marker_regions() + self._lifted + [t.data_ptr() for t in
                                                        self.canaries.values()]
        self.lib.wbp_assign(_arr(ptrs), len(ptrs), self.RW)
        if self.api is not None:
            self.api.stop()

    def to_dict(self) -> dict:
        out = {**super().to_dict(), "tool_attached": self.attached == 0,
               "caching_allocator": self.caching, "heaps": list(self.heaps.values())}
        if self.zones is not None:  # else the watch's own record says why there are none
            out["redzones"] = self.zones.to_dict()
        return out


class ApiGuard(_Base):
    """CUPTI alone (``sanitize="api"``, no memcheck): no permission, only the CUDA API's
    copies and memsets into the watched ranges named at the call (``workbook.hooks.watch.apiwrites``);
    suspended around the state's own writers like the other forms' lifts."""

    mode = "api"

    def __init__(self, state, out_dir: str | None, canaries: dict):
        super().__init__(state, out_dir)
        self.canaries = canaries

    def attach(self) -> None:
        self.protected = list(MARKERS) + list(self.canaries) + list(LIFTED)
        self.notes.append("no read-only permission (sanitize='api'): kernels' writes are the "
                          "watch's value comparison's; copies and memsets through the CUDA API "
                          "are named at the call (CUPTI)")
        self.api_ranges()

    def lift(self) -> None:
        self.lifts += 1
        if self.api is not None:
            self.api.suspend()

    def restore(self) -> None:
        if self.api is not None:
            self.api_ranges()
            self.api.resume()

    def release(self) -> None:
        if self.api is not None:
            self.api.stop()


# ---- the wiring into the budget state's writers ------------------------------------------------

_current: list[_Base] = []
_patches: PatchSet | None = None


def _legit_wrapper(orig):
    def wrapper(self, *a, **k):
        g = next((g for g in _current if g.state is self), None)
        if g is None:
            return orig(self, *a, **k)
        g.lift()
        try:
            return orig(self, *a, **k)
        finally:
            g.restore()
    wrapper.__wrapped__ = orig
    return wrapper


def _wire() -> None:
    global _patches
    if _patches is None:
        from vllm.v1.worker.gpu.sample import thinking_budget as tbm

        ps = PatchSet("protect", "watch")
        for m in LEGIT:
            ps.wrap(tbm.ThinkingBudgetState, m, _legit_wrapper)
        _patches = ps
    _patches.install()


def _with_api(g, out_dir: str | None, where) -> None:
    """Subscribe the CUPTI watcher for guard ``g`` (GPU forms); what fails is recorded."""
    from workbook.hooks.watch import apiwrites

    g.api, g.api_status = apiwrites.attach("cuda", out_dir, where)
    if g.api is None:
        g.notes.append(g.api_status["message"])


def attach(mode: str, state, *, out_dir: str | None, canaries: dict | None = None,
           where=None, zones=None):
    """Protect ``state``'s tensors in ``mode`` (``page`` / ``nvtx`` / ``api``); returns the
    guard. Raises ``ProtectError`` naming what is missing. ``where``: the watch's position
    (for the CUPTI watcher's records, GPU forms); ``zones``: the markers' red zones
    (``workbook.hooks.watch.redzone.pad``, nvtx only), read-only with them."""
    if mode == "api":
        g = ApiGuard(state, out_dir, canaries or {})
        _with_api(g, out_dir, where)
        if g.api is None:
            raise ProtectError(g.api_status["message"])
        g.attach()
    elif mode == "page":
        g = PageGuard(state, out_dir)
        g.attach()
    elif mode == "nvtx":
        req = requirements("nvtx")
        if not req["found"]["C++ compiler"] or not req["found"]["NVTX headers"] or \
                not req["found"]["CUDA runtime headers"]:
            raise ProtectError(req["message"])
        g = NvtxGuard(state, out_dir, load_shim(build_shim()), canaries or {}, zones)
        # CUPTI cannot subscribe beside compute-sanitizer (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_
        # SUPPORTED, H100): under it the CUDA API's copies and memsets are another pass's
        # (workbook.run.writer.stage: the auto plan's api pass); WORKBOOK_API_WRITES=1 tries anyway
        under = os.environ.get("WORKBOOK_UNDER_SANITIZER") == "1"
        if os.environ.get("WORKBOOK_API_WRITES", "0" if under else "1") != "0":
            _with_api(g, out_dir, where)
        elif under:
            g.api_status = {"on": False, "message": API_BESIDE_SANITIZER}
        g.attach()
    else:
        raise ProtectError(f"protect={mode!r}: choose one of {MODES[2:]}")
    _current.append(g)
    _wire()
    return g


def detach(g) -> None:
    if g in _current:
        g.release()
        _current.remove(g)
    if not _current and _patches is not None:
        _patches.remove()
