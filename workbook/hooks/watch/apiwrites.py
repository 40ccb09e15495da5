"""Writes through the CUDA API into the watched tensors, caught at the call (issue #27).

memcheck holds kernels to NVTX memory permissions, not copies and memsets through the CUDA API:
a PyTorch ``copy_`` into an alias of a marker (``cudaMemcpyAsync``) or a raw
``cudaMemsetAsync`` changes the marker with no memcheck record. This module subscribes to
CUPTI's callback API (``workbook/native/cupti_writes.cpp``, built here with the host's C++
compiler against CUPTI's headers and linked with the host's ``libcupti``) for the runtime's
``cudaMemcpy*`` / ``cudaMemset*`` and the driver's ``cuMemcpy*`` / ``cuMemsetD*`` entry points
(a runtime call's own driver twin is skipped). At each call's entry, on the calling thread, the
destination range ``[dst, dst + bytes)`` is compared with the watched ranges; a hit calls back
into Python, which records:

- the call (CUPTI's function name), the destination range, the source (a copy) or the value
  (a memset), the watched tensors it overlaps and the bytes of each it covers;
- the Python stack at the call (innermost first; full paths, so the launching frame is judged
  by module: ``workbook.run.writer.frames.name_writer``);
- the watch's position at that moment (its last boundary, the phase, the real step).

Records go to ``<out_dir>/api_writes.json`` as they happen (a pass that dies later keeps them).
The state's own writers (``apply`` / ``apply_staged_writes``) are not reported: the guard
suspends the subscriber around them, as it lifts the NVTX permissions. Where there is no CUDA
device, no CUPTI or no compiler, ``requirements`` names what is missing and nothing is
subscribed ("not available on this platform").

Deliberately not here: judging the frame or writing the headline (``workbook.run``).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import traceback

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "native",
                   "cupti_writes.cpp")
FILE = "api_writes.json"
MAX_RECORDS = 64
_HIT = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64,
                        ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64)


class ApiWritesError(RuntimeError):
    """The subscriber cannot be set up (named in the message)."""


def _roots() -> list[str]:
    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    return [r for r in roots if r and os.path.isdir(r)]


def _candidates(sub: str) -> list[str]:
    """Folders that may hold CUPTI's ``include`` / ``lib``: the toolkit (``extras/CUPTI``,
    ``targets/*``, the root) and the NVIDIA wheels beside torch (``nvidia/*``, ``nvidia/cu*/``)."""
    out = []
    for r in _roots():
        out += [os.path.join(r, "extras", "CUPTI", sub if sub == "include" else "lib64"),
                os.path.join(r, sub), os.path.join(r, "lib64")]
        out += glob.glob(os.path.join(r, "targets", "*", sub))
    site = sysconfig.get_paths().get("purelib", "")
    for base in [site] + [p for p in sys.path if p.endswith("-packages")]:
        out += glob.glob(os.path.join(base, "nvidia", "*", sub)) + \
            glob.glob(os.path.join(base, "nvidia", "*", "*", sub))
    seen, keep = set(), []
    for d in out:
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            keep.append(d)
    return keep


def find_cupti() -> dict:
    """``{"include": dir with cupti.h and cuda.h, "lib": path of libcupti.so*}`` (None where
    not found). ``WORKBOOK_CUPTI_INCLUDE`` / ``WORKBOOK_CUPTI_LIB`` override."""
    inc = os.environ.get("WORKBOOK_CUPTI_INCLUDE") or next(
        (d for d in _candidates("include") if os.path.exists(os.path.join(d, "cupti.h"))), None)
    lib = os.environ.get("WORKBOOK_CUPTI_LIB") or next(
        (f for d in _candidates("lib") for f in sorted(glob.glob(os.path.join(d, "libcupti.so*")),
                                                       key=len)), None)
    cuda = next((d for d in [inc] + _candidates("include")
                 if d and os.path.exists(os.path.join(d, "cuda.h"))), None)
    return {"include": inc, "cuda_include": cuda, "lib": lib}


def requirements(platform: str) -> dict:
    """What the subscriber needs on this host: ``{"ok", "missing", "message", "found"}``."""
    if platform != "cuda":
        return {"ok": False, "missing": ["a CUDA device"], "found": {},
                "message": "writes through the CUDA API: not available on this platform "
                           f"({platform}: no CUDA API to subscribe to)"}
    found = find_cupti()
    cxx = os.environ.get("CXX") or next((c for c in ("g++", "c++") if _which(c)), None)
    found["C++ compiler"] = cxx
    missing = [k for k, v in (("CUPTI headers (cupti.h)", found["include"]),
                              ("CUDA driver headers (cuda.h)", found["cuda_include"]),
                              ("libcupti", found["lib"]), ("a C++ compiler", cxx)) if not v]
    return {"ok": not missing, "missing": missing, "found": found,
            "message": None if not missing else
            "writes through the CUDA API: not watched (missing: " + ", ".join(missing) + ")"}


def _which(c: str) -> str | None:
    import shutil

    return shutil.which(c)


def build(cache_dir: str | None = None) -> str:
    """Compile ``cupti_writes.cpp`` (cached by source, flags and library); returns its path."""
    req = requirements("cuda")
    if not req["ok"]:
        raise ApiWritesError(req["message"])
    f = req["found"]
    cxx = f["C++ compiler"]
    incs = sorted({f["include"], f["cuda_include"]})
    flags = ["-O2", "-shared", "-fPIC"] + [f"-I{d}" for d in incs]
    link = [f["lib"], f"-Wl,-rpath,{os.path.dirname(f['lib'])}"]
    with open(SRC, "rb") as fh:
        src = fh.read()
    key = hashlib.sha256(src + " ".join([cxx] + flags + link).encode()).hexdigest()[:16]
    cache_dir = cache_dir or os.path.join(os.environ.get("WORKBOOK_CACHE", "/tmp/workbook-cache"),
                                          "native")
    os.makedirs(cache_dir, exist_ok=True)
    out = os.path.join(cache_dir, f"cupti_writes-{key}.so")
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        p = subprocess.run([cxx, *flags, SRC, "-o", tmp, *link], capture_output=True, text=True)
        if p.returncode != 0:
            raise ApiWritesError(f"building the CUPTI subscriber failed ({cxx}): "
                                 f"{p.stderr[-1500:]}")
        os.replace(tmp, out)
    return out


def overlap(dst: int, nbytes: int, ranges: list[dict]) -> list[dict]:
    """The watched ranges ``[dst, dst + nbytes)`` covers: per tensor its name, the first and
    last byte covered (offsets inside it) and how many of its bytes that is."""
    out = []
    hi = dst + nbytes
    for r in ranges:
        lo_t, hi_t = r["ptr"], r["ptr"] + r["nbytes"]
        a, b = max(dst, lo_t), min(hi, hi_t)
        if a < b:
            out.append({"tensor": r["name"], "first_byte": a - lo_t, "last_byte": b - 1 - lo_t,
                        "bytes": b - a, "tensor_nbytes": r["nbytes"],
                        "whole": a == lo_t and b == hi_t})
    return out


def stack_frames(skip: int = 0, limit: int = 40) -> list[dict]:
    """The calling thread's Python stack, innermost first (this module's frames left out)."""
    here = os.path.abspath(__file__)
    frames = [f for f in reversed(traceback.extract_stack()[:-1 - skip])
              if os.path.abspath(f.filename) != here]
    return [{"func": f.name, "file": f.filename, "line": f.lineno} for f in frames[:limit]]


class ApiWatch:
    """One CUPTI subscriber for one watch: ranges, suspension, the records of hits."""

    def __init__(self, out_dir: str | None, where=None, lib=None):
        self.out_dir = out_dir
        self.where = where  # () -> the watch's position (dict) at the call
        self.lib = lib
        self.ranges: list[dict] = []
        self.records: list[dict] = []
        self.dropped = 0
        self.suspended = 0
        self.error: str | None = None
        self._cb = _HIT(self._hit)  # kept alive as long as the subscriber

    # -- the C side ------------------------------------------------------------------------
    def start(self) -> None:
        lib = self.lib
        lib.wcw_start.argtypes = [_HIT]
        lib.wcw_start.restype = ctypes.c_int
        lib.wcw_error.restype = ctypes.c_char_p
        lib.wcw_ranges.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                   ctypes.c_size_t]
        lib.wcw_suspend.argtypes = [ctypes.c_int]
        lib.wcw_calls.restype = ctypes.c_uint64
        rc = lib.wcw_start(self._cb)
        if rc != 0:
            raise ApiWritesError(f"CUPTI refused the subscriber: "
                                 f"{lib.wcw_error().decode(errors='replace')}")
        self.write()

    def set_ranges(self, ranges: list[dict]) -> None:
        """``ranges``: ``[{"name", "ptr", "nbytes"}, ...]`` (zero-sized ones left out)."""
        self.ranges = [r for r in ranges if r["nbytes"] > 0 and r["ptr"]]
        if self.lib is not None:
            n = len(self.ranges)
            lo = (ctypes.c_uint64 * n)(*[r["ptr"] for r in self.ranges])
            hi = (ctypes.c_uint64 * n)(*[r["ptr"] + r["nbytes"] for r in self.ranges])
            self.lib.wcw_ranges(lo, hi, n)

    def suspend(self) -> None:
        self.suspended += 1
        if self.lib is not None:
            self.lib.wcw_suspend(1)

    def resume(self) -> None:
        if self.lib is not None:
            self.lib.wcw_suspend(0)

    def stop(self) -> None:
        if self.lib is not None:
            self.write()
            self.lib.wcw_stop()

    # -- a hit -----------------------------------------------------------------------------
    def _hit(self, call, dst, nbytes, src, is_memset, value) -> None:
        try:
            self.record(call.decode(errors="replace") if call else "?", int(dst), int(nbytes),
                        int(src), bool(is_memset), int(value), stack_frames(skip=1))
        except Exception as e:  # never raise into the CUDA call
            self.error = f"{type(e).__name__}: {e}"

    def record(self, call: str, dst: int, nbytes: int, src: int, is_memset: bool, value: int,
               frames: list[dict]) -> dict | None:
        if len(self.records) >= MAX_RECORDS:
            self.dropped += 1
            return None
        pos = None
        if self.where is not None:
            try:
                pos = self.where()
            except Exception as e:  # evidence only
                pos = {"error": f"{type(e).__name__}: {e}"}
        rec = {"seq": len(self.records) + 1, "call": call,
               "kind": "memset" if is_memset else "copy",
               "dst": dst, "dst_hex": hex(dst), "bytes": nbytes,
               "src_hex": hex(src) if not is_memset and src else None,
               "value": value if is_memset else None,
               "overlaps": overlap(dst, nbytes, self.ranges),
               "frames": frames, "position": pos}
        self.records.append(rec)
        self.write()
        return rec

    def write(self) -> None:
        if not self.out_dir:
            return
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            path = os.path.join(self.out_dir, FILE)
            with open(path + ".tmp", "w") as f:
                json.dump(self.to_dict(), f, indent=1, default=str)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def to_dict(self) -> dict:
        calls = int(self.lib.wcw_calls()) if self.lib is not None else None
        return {"subscribed": self.lib is not None, "calls_seen": calls, "ranges": [{"name": r["name"], "ptr_hex": hex(r["ptr"]),
                                                 "nbytes": r["nbytes"]} for r in self.ranges],
                "suspensions": self.suspended, "records": self.records,
                "dropped": self.dropped, "error": self.error}


def attach(platform: str, out_dir: str | None, where=None) -> tuple[ApiWatch | None, dict]:
    """Subscribe for one watch; returns ``(watch or None, status)``. ``status["message"]``
    says why nothing was subscribed (never raises: the rest of the watch goes on)."""
    req = requirements(platform)
    if not req["ok"]:
        return None, {"on": False, "message": req["message"], "missing": req["missing"]}
    try:
        lib = ctypes.CDLL(build())
        w = ApiWatch(out_dir, where, lib)
        w.start()
    except (ApiWritesError, OSError) as e:
        return None, {"on": False, "message": f"writes through the CUDA API: not watched ({e})",
                      "missing": []}
    return w, {"on": True, "message": None, "missing": [], "cupti": req["found"]["lib"]}
