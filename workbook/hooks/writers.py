"""Writers of three kinds hidden in the MTP drafter, for the sanitizer stage's own tests.

The H-i faults (``workbook.hooks.faults``) write through a PyTorch op; the sanitizer stage must
also name writers PyTorch never sees. ``hide(kind)`` (before the engine starts) arms one writer
inside the drafter model's forward — so inside ``Speculator.propose`` — active during the
profiling run only, once. It zeroes the budget state's marker tensors with:

- ``alias_fill``:   ``fill_(0)`` on a raw alias of the storage (a PyTorch op, ``_version``
  unchanged: ``faults.raw_alias_zero``);
- ``memset``:       a raw memset through ctypes, outside the dispatcher: libc ``memset`` on
  CPU, ``cudaMemsetAsync`` on the current stream on a GPU;
- ``triton_store``: a Triton kernel storing 0 (Triton's interpreter on CPU).

``WRITTEN`` records what fired (kind, tensors, the function that wrote) — the ground truth a
test compares the named writer with. Not a fault of the catalogue: no hypothesis, no guard.
"""

from __future__ import annotations

import ctypes
import glob
import os

from workbook.vllm.patching import PatchSet

KINDS = ("alias_fill", "memset", "triton_store")
WRITTEN: list[dict] = []
_TRITON: dict = {}


def alias_fill(t) -> None:
    from workbook.hooks.faults import raw_alias_zero

    raw_alias_zero(t)


def _cudart():
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    try:
        import torch

        root = os.path.dirname(os.path.dirname(torch.__file__))
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
    except Exception:
        pass
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise RuntimeError(f"memset writer: no CUDA runtime library found (tried {names[:3]} and "
                       "torch's nvidia/*/lib)")


def memset(t) -> None:
    nbytes = t.numel() * t.element_size()
    if t.device.type == "cuda":
        import torch

        rt = _cudart()
        rt.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                       ctypes.c_void_p]
        err = rt.cudaMemsetAsync(t.data_ptr(), 0, nbytes, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"cudaMemsetAsync returned {err}")
    else:
        ctypes.memset(t.data_ptr(), 0, nbytes)


def _store_kernel():
    if "k" not in _TRITON:
        import triton
        import triton.language as tl

        @triton.jit
        def zero_store(ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(ptr + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < n)

        _TRITON["k"] = zero_store
    return _TRITON["k"]


def triton_store(t) -> None:
    import torch

    k = _store_kernel()
    with torch.inference_mode():
        k[(1,)](t, t.numel(), BLOCK=max(16, 1 << (t.numel() - 1).bit_length()))


WRITE = {"alias_fill": alias_fill, "memset": memset, "triton_store": triton_store}


def hide(kind: str) -> PatchSet:
    """Arm a ``kind`` writer in the drafter's forward for the profiling run (install before the
    engine starts)."""
    if kind not in KINDS:
        raise ValueError(f"writer kind {kind!r}: choose one of {KINDS}")
    from workbook.hooks.faults import MARKER_ATTRS
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    box = {"runner": None, "profile": 0}

    def arm(runner):
        spec = getattr(runner, "speculator", None)
        model = getattr(spec, "model", None)
        if model is None:
            raise RuntimeError(f"writer {kind}: no drafter model (needs spec_method='mtp')")
        orig = model.forward

        def forward(*a, **k):
            out = orig(*a, **k)
            if box["profile"] and not WRITTEN:
                st = runner.sampler.thinking_budget_state
                if getattr(st, "enabled", False):
                    WRITTEN.append({"kind": kind, "function": WRITE[kind].__name__,
                                    "tensors": list(MARKER_ATTRS)})
                    for attr in MARKER_ATTRS:
                        WRITE[kind](getattr(st, attr))
            return out

        model.forward = forward

    def make_load(orig):
        def load_model(runner, *a, **k):
            out = orig(runner, *a, **k)
            if box["runner"] is None:
                box["runner"] = runner
                arm(runner)
            return out
        return load_model

    def make_profile(orig):
        def profile_run(runner, *a, **k):
            box["profile"] += 1
            try:
                return orig(runner, *a, **k)
            finally:
                box["profile"] -= 1
        return profile_run

    ps = PatchSet(f"writer:{kind}", "fault")
    ps.wrap(GPUModelRunner, "load_model", make_load)
    ps.wrap(GPUModelRunner, "profile_run", make_profile)
    return ps.install()
