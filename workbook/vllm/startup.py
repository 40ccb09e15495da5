"""MRV2's start-up as the workbook names it: phase methods, the budget state's tensors, real steps.

What happens between ``vllm.LLM(...)`` (or ``vllm serve``) and the first real engine step, per
platform (measured, vLLM 0.29.0 / 0.32.0; brief §4):

- both: ``GPUModelRunner.__init__`` (runner construction) → ``load_model`` (target, then the
  speculator's ``load_model``, then ``Sampler.__init__`` → ``ThinkingBudgetState.__init__``:
  *state creation*) → memory profiling → ``initialize_kv_cache`` → warm-up → real steps;
- GPU worker: ``determine_available_memory`` always runs ``profile_run`` →
  ``_dummy_run(is_profile=True)`` → target ``execute_model`` then ``speculator.propose(...,
  dummy_run=True)`` → ``_dummy_sampler_run``; ``compile_or_warm_up_model`` runs warm-up
  ``_dummy_run``\\ s, ``kernel_warmup``, ``warmup_kernels`` (JIT warm-up, not with eager) and
  ``capture_model`` (CUDA graphs, not with eager);
- CPU worker 0.30+: ``warming_up_model`` → ``profile_run`` only when
  ``CPUWorker._should_warm_up_model()`` (not with eager mode plus an explicit
  ``kv_cache_memory_bytes`` — the workbook's CPU default); 0.29: always.

The watch (``workbook.hooks.watch``) wraps the methods of ``PHASE_METHODS`` and names the phase a
boundary lies in with ``classify`` from the stack of wrapped methods that were running, so the
phases listed in its evidence are the ones that really ran on that platform.

``STATE_TENSORS``: the device tensors of ``ThinkingBudgetState`` a stray writer can hit, with
their role and the methods allowed to change them (``ALLOWED_WRITERS``); ``state_tensors``
raises ``StateLayoutError`` naming a tensor a vLLM version lacks.

Not here: patching (``workbook.hooks.watch``), reading values (``workbook.hooks.watch``).
"""

from __future__ import annotations

import inspect
import re

from workbook.core import budget

PKG = "vllm.v1.worker"

# (module, class, methods): wrapped where the class defines the method itself. Worker classes
# are wrapped when the runner is built (their modules are still importing when the plugin runs).
RUNNER_PHASES = [
    (f"{PKG}.gpu.model_runner", "GPUModelRunner",
     ("__init__", "load_model", "profile_run", "_dummy_run", "_dummy_sampler_run",
      "profile_cudagraph_memory", "initialize_kv_cache", "capture_model", "execute_model",
      "sample_tokens")),
    (f"{PKG}.cpu.model_runner", "CPUModelRunner", ("warming_up_model",)),
    (f"{PKG}.gpu.sample.sampler", "Sampler", ("__init__",)),
    (f"{PKG}.gpu.sample.thinking_budget", "ThinkingBudgetState",
     ("add_request", "apply_staged_writes", "apply")),
]
WORKER_PHASES = [
    (f"{PKG}.gpu_worker", "Worker",
     ("load_model", "determine_available_memory", "initialize_from_config",
      "compile_or_warm_up_model", "execute_model", "sample_tokens")),
    (f"{PKG}.cpu_worker", "CPUWorker",
     ("determine_available_memory", "compile_or_warm_up_model")),
]
WORKER_FUNCS = [(f"{PKG}.gpu_worker", ("kernel_warmup", "warmup_kernels"))]
SPECULATOR_METHODS = ("load_model", "propose", "capture")
SPECULATOR = "Speculator"  # qualname prefix of the speculator's wrapped methods

# the device tensors of ThinkingBudgetState (attribute path -> role)
STATE_TENSORS = {
    **{attr: "marker" for attr in budget.KEYS.values()},
    "cached_last_start": "marker cache",
    "cached_last_end": "marker cache",
    "cached_scan_pos": "scan position",
    "thinking_token_budget.gpu": "budget device view",
}
# who may change a role's bytes (qualnames of wrapped methods; markers and canaries: nobody)
ALLOWED_WRITERS = {
    "marker cache": ("ThinkingBudgetState.apply_staged_writes", "ThinkingBudgetState.apply"),
    "scan position": ("ThinkingBudgetState.apply_staged_writes", "ThinkingBudgetState.apply"),
    "budget device view": ("ThinkingBudgetState.apply_staged_writes",),
}


class StateLayoutError(RuntimeError):
    """The installed vLLM's ``ThinkingBudgetState`` lacks a tensor the watch needs."""


def resolve_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def state_tensors(state, version: str = "?") -> dict:
    """``{name: tensor}`` for every ``STATE_TENSORS`` entry of a live, enabled state."""
    out, missing = {}, []
    for name in STATE_TENSORS:
        t = resolve_path(state, name)
        if t is None or not hasattr(t, "data_ptr"):
            missing.append(name)
        else:
            out[name] = t
    if missing:
        raise StateLayoutError(
            f"vLLM {version}: ThinkingBudgetState has no device tensor {missing[0]!r}"
            f"{' (also ' + ', '.join(missing[1:]) + ')' if missing[1:] else ''}; the start-up "
            f"watch needs {list(STATE_TENSORS)}")
    return out


def check_state_class(cls, version: str = "?") -> None:
    """Before any engine starts: every ``STATE_TENSORS`` attribute must be assigned in
    ``cls.__init__`` (read from its source); raises ``StateLayoutError`` naming the first
    missing one."""
    try:
        src = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return  # no source: checked again on the live state
    assigned = set(re.findall(r"self\.(\w+)\s*[:=]", src))
    missing = [n for n in STATE_TENSORS if n.split(".")[0] not in assigned]
    if missing:
        raise StateLayoutError(
            f"vLLM {version}: {cls.__qualname__}.__init__ never sets {missing[0]!r}"
            f"{' (nor ' + ', '.join(missing[1:]) + ')' if missing[1:] else ''}; the start-up "
            f"watch needs {list(STATE_TENSORS)}")


def is_real_step(scheduler_output, kwargs) -> bool:
    """A runner ``execute_model`` call for real requests (not a dummy / profiling / warm-up
    run: vLLM's warm-up request ids start with ``_``)."""
    if kwargs.get("dummy_run"):
        return False
    ids = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    return any(not str(r).startswith("_") for r in ids)


# ---- naming the phase of a boundary ------------------------------------------------------------

TOP = {  # method (last part of the qualname) or qualname -> phase; innermost match wins
    "GPUModelRunner.__init__": "runner construction",
    "ThinkingBudgetState.__init__": "state creation",
    "Sampler.__init__": "state creation",
    f"{SPECULATOR}.load_model": "drafter load",
    "GPUModelRunner.load_model": "model load",
    "Worker.load_model": "model load",
    "profile_run": "profiling run",
    "profile_cudagraph_memory": "CUDA-graph memory profiling",
    "capture_model": "CUDA-graph capture",
    f"{SPECULATOR}.capture": "CUDA-graph capture",
    "initialize_kv_cache": "KV-cache allocation",
    "initialize_from_config": "KV-cache allocation",
    "compile_or_warm_up_model": "warm-up",
    "kernel_warmup()": "warm-up",
    "warmup_kernels()": "warm-up",
    "determine_available_memory": "memory profiling",
}
SUB = {
    "GPUModelRunner.execute_model": "target forward",
    f"{SPECULATOR}.propose": "drafter propose",
    "_dummy_sampler_run": "dummy sampler",
    "GPUModelRunner.sample_tokens": "sampling",
    "ThinkingBudgetState.apply": "budget apply",
    "ThinkingBudgetState.apply_staged_writes": "budget staged writes",
    "ThinkingBudgetState.add_request": "budget registration",
}
def _key(q: str) -> list[str]:
    return [q, q.rsplit(".", 1)[-1]]


def classify(stack, *, kv_ready: bool = False, step: int = 0) -> str:
    """The named phase of a point whose running wrapped methods are ``stack`` (outermost
    first), e.g. ``"profiling run › target forward"``, ``"step 3 › drafter propose"``."""
    top = sub = None
    for q in reversed(list(stack)):
        for k in _key(q):
            if sub is None and k in SUB and top is None:
                sub = SUB[k]
            if k in TOP:
                top = TOP[k]
                break
        if top is not None:
            break
    if top is None:
        names = {k for q in stack for k in _key(q)}
        if "_dummy_run" in names:
            top = "warm-up" if kv_ready else "profiling run"
        elif step:
            top = f"step {step}" + (" (first real step)" if step == 1 else "")
        elif not stack:
            return "between phases"
        else:
            top = "start-up"
    return f"{top} › {sub}" if sub and sub != top else top


def top_phase(name: str) -> str:
    return name.split(" › ", 1)[0]


# ---- naming the phase from a call stack (a fault's or a memcheck record's Python frames) -------

_FILE_CLASS = (  # (path fragment, class) -> qualnames the phase tables know
    ("/worker/gpu/model_runner.py", "GPUModelRunner"),
    ("/worker/cpu/model_runner.py", "CPUModelRunner"),
    ("/worker/gpu_worker.py", "Worker"),
    ("/worker/cpu_worker.py", "CPUWorker"),
    ("/worker/gpu/spec_decode/", SPECULATOR),
    ("/worker/gpu/sample/thinking_budget.py", "ThinkingBudgetState"),
    ("/worker/gpu/sample/sampler.py", "Sampler"),
)
_BASE_CLASS = {  # a frame named by its file's base name alone (memcheck's Python backtrace:
    # compute-sanitizer prints ``propose in speculator.py:312``), so on a GPU: the GPU classes
    "model_runner.py": "GPUModelRunner", "gpu_worker.py": "Worker",
    "speculator.py": SPECULATOR, "thinking_budget.py": "ThinkingBudgetState",
    "sampler.py": "Sampler",
}
_PHASE_FUNCS = {m for _, _, ms in RUNNER_PHASES + WORKER_PHASES for m in ms} | \
    set(SPECULATOR_METHODS) | {f for _, fs in WORKER_FUNCS for f in fs}


def phase_from_frames(frames) -> str:
    """The phase a call stack lies in, from ``(file, function)`` pairs outermost first (the
    frames of a fault handler's dump, with paths, or of a memcheck record's host backtrace,
    with base names only): vLLM's phase methods are recognised by file and name and named by
    ``classify``. Steps are not counted here (a stack does not say which step it is)."""
    stack = []
    for path, func in frames:
        p = path.replace("\\", "/")
        if func not in _PHASE_FUNCS:
            continue
        cls = next((c for frag, c in _FILE_CLASS if frag in p), None) if "/" in p else \
            _BASE_CLASS.get(p)
        if cls is not None:
            stack.append(f"{cls}.{func}")
        elif "/worker/gpu_worker.py" in p or "/v1/worker/" in p:
            stack.append(f"{func}()")
    real = "GPUModelRunner.execute_model" in stack and "GPUModelRunner._dummy_run" not in stack
    return classify(stack, step=1 if real else 0).replace("step 1 (first real step)",
                                                         "a real step")
