"""Writers of three kinds hidden in the MTP drafter, for the sanitizer stage's own tests.

The H-i faults (``workbook.hooks.faults.budget``) write through a PyTorch op; the sanitizer stage must
also name writers PyTorch never sees. ``hide(kind)`` (before the engine starts) arms one writer
inside the drafter model's forward — so inside ``Speculator.propose`` — active during the
profiling run only, once. It zeroes the budget state's marker tensors with:

- ``alias_fill``:   ``fill_(0)`` on a raw alias of the storage (a PyTorch op, ``_version``
  unchanged: ``faults.raw_alias_zero``);
- ``copy``:         ``copy_`` of a zero tensor into a raw alias of the storage (same dtype,
  contiguous: PyTorch copies device to device with ``cudaMemcpyAsync``, a write through the
  CUDA API that memcheck does not hold to NVTX permissions);
- ``memset``:       a raw memset through ctypes, outside the dispatcher: libc ``memset`` on
  CPU, ``cudaMemsetAsync`` on the current stream on a GPU;
- ``triton_store``: a Triton kernel storing 0 (Triton's interpreter on CPU);
- ``triton_user``:  a Triton kernel of a user's module outside the workbook, called through
  that module's wrapper (``clear_ids`` of ``tests/data/user_kernels.py``, or the file
  ``WORKBOOK_USER_WRITER`` names): the named frame must be the wrapper's, in that module.

- ``overrun``:      the user module's Triton kernel (``fill_ids``) from
  ``WORKBOOK_OVERRUN_BYTES`` (default 1024) below the marker — in whatever neighbours it —
  through the marker's last byte: a neighbour's write running into the marker from below (the
  red zones of ``workbook.hooks.watch.redzone`` fault first). Writes memory the workbook does not
  own: a fault writer for the sanitizer stage only.

``hide(kind, step=N)`` writes during the drafter forward of the N-th real step instead (a
writer after start-up); the spec ``"kind@N"`` (``workbook.run.writer.command --probe KIND
--writer-step N``) says the same.

``WRITTEN`` records what fired (kind, tensors, the function that wrote) — the ground truth a
test compares the named writer with. Not a fault of the catalogue: no hypothesis, no guard.
"""

from __future__ import annotations

import ctypes
import glob
import os

from workbook.vllm.patching import PatchSet
from workbook.core.envfiles import REPO

KINDS = ("alias_fill", "copy", "memset", "triton_store", "triton_user", "overrun")
OVERRUN_ENV = "WORKBOOK_OVERRUN_BYTES"
USER_WRITER = os.path.join(REPO, "tests", "data", "user_kernels.py")
WRITTEN: list[dict] = []
_TRITON: dict = {}


def alias_fill(t) -> None:
    from workbook.hooks.faults.budget import raw_alias_zero

    raw_alias_zero(t)


def copy(t) -> None:
    """``copy_`` into a raw alias of ``t``'s storage (``_version`` of ``t`` unchanged)."""
    import torch

    from workbook.hooks.faults.budget import raw_alias

    with torch.inference_mode():
        alias = raw_alias(t)
        alias.copy_(torch.zeros_like(alias))


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


def _user_module():
    if "user" not in _TRITON:
        import importlib.util

        path = os.environ.get("WORKBOOK_USER_WRITER") or USER_WRITER
        if not os.path.exists(path):
            raise RuntimeError(f"triton_user writer: no user module at {path} "
                               "(set WORKBOOK_USER_WRITER)")
        spec = importlib.util.spec_from_file_location("user_kernels", path)
        mod = importlib.util.module_from_spec(spec)
        import sys

        sys.modules["user_kernels"] = mod
        spec.loader.exec_module(mod)
        _TRITON["user"] = mod
    return _TRITON["user"]


def triton_user(t) -> None:
    import torch

    with torch.inference_mode():
        _user_module().clear_ids(t)


def overrun(t) -> None:
    """The user's kernel from ``WORKBOOK_OVERRUN_BYTES`` below ``t`` through its last byte: the
    kernel's pointer argument is ``t`` itself (a live allocation, as Triton's launcher checks),
    its start index negative, so the stores begin in whatever lies below ``t``."""
    import torch

    below = int(os.environ.get(OVERRUN_ENV, "1024"))
    if below <= 0 or below % 4:
        raise ValueError(f"{OVERRUN_ENV}={below}: a positive multiple of 4")
    with torch.inference_mode():
        _user_module().fill_ids(t, 0, start=-(below // 4), n=below // 4 + t.numel())


WRITE = {"alias_fill": alias_fill, "copy": copy, "memset": memset, "triton_store": triton_store,
         "triton_user": triton_user, "overrun": overrun}
FUNCTION = {"triton_user": "clear_ids", "overrun": "fill_ids"}  # the frame a test expects (else the WRITE function)


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"kind"`` or ``"kind@N"`` (write in real step N) → ``(kind, N or None)``."""
    kind, _, step = spec.partition("@")
    if kind not in KINDS:
        raise ValueError(f"writer kind {kind!r}: choose one of {KINDS}")
    if step and (not step.isdigit() or int(step) < 1):
        raise ValueError(f"writer step {step!r}: a real step number (1, 2, ...)")
    return kind, int(step) if step else None


def hide(kind: str, step: int | None = None) -> PatchSet:
    """Arm a ``kind`` writer in the drafter's forward for the profiling run, or for real step
    ``step`` (install before the engine starts)."""
    if kind not in KINDS:
        raise ValueError(f"writer kind {kind!r}: choose one of {KINDS}")
    from workbook.hooks.faults.budget import MARKER_ATTRS
    from workbook.vllm import startup
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if kind in ("triton_user", "overrun"):
        _user_module()  # imported now: a missing module is named before the engine starts
    box = {"runner": None, "profile": 0, "step": 0}

    def arm(runner):
        spec = getattr(runner, "speculator", None)
        model = getattr(spec, "model", None)
        if model is None:
            raise RuntimeError(f"writer {kind}: no drafter model (needs spec_method='mtp')")
        orig = model.forward

        def forward(*a, **k):
            out = orig(*a, **k)
            due = box["step"] == step if step else box["profile"]
            if due and not WRITTEN:
                st = runner.sampler.thinking_budget_state
                if getattr(st, "enabled", False):
                    WRITTEN.append({"kind": kind, "step": step or 0,
                                    "function": FUNCTION.get(kind, WRITE[kind].__name__),
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

    def make_execute(orig):
        def execute_model(runner, *a, **k):
            if startup.is_real_step(a[0] if a else k.get("scheduler_output"), k):
                box["step"] += 1
            return orig(runner, *a, **k)
        return execute_model

    ps = PatchSet(f"writer:{kind}" + (f"@step{step}" if step else ""), "fault")
    ps.wrap(GPUModelRunner, "load_model", make_load)
    ps.wrap(GPUModelRunner, "profile_run", make_profile)
    if step:
        ps.wrap(GPUModelRunner, "execute_model", make_execute)
    return ps.install()
