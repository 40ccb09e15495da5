"""The process environment vLLM and the workbook's hooks read: assembled here, once.

Two groups of variables:

- what vLLM must see before it is imported (``vllm_env``): offline hub, no usage stats, the
  in-process or multiprocess engine, the runner choice (``VLLM_USE_V2_MODEL_RUNNER``: ``1`` for
  ``runner=v2``, ``0`` for ``v1``, unset for ``auto``; fault H-h forces ``0`` — a V2 run
  silently served by V1), ``VLLM_TRITON_FORCE_FIRST_CONFIG`` (a default the caller's own value
  wins over), and on a CPU the Triton-interpreter shim switch;
- what the workbook plugin reads inside vLLM's own processes (``hook_env``): the fault, the
  guard, the trace folder and flush cadence, the worker-side effective-configuration folder,
  the start-up watch (names in ``HOOK_VARS``).

``apply(env, target)`` writes such a mapping into ``os.environ`` or a copy (a value of ``None``
unsets; ``DEFAULTS`` keys only fill a gap). ``prepare_process(cfg)`` does it for an in-process
engine; ``server_env(cfg, ...)`` builds a subprocess's environment.

Not here: reading configuration back from a live engine (``workbook.vllm.effective``).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

FAULT = "WORKBOOK_FAULT"
GUARD = "WORKBOOK_GUARD"
TRACE_DIR = "WORKBOOK_TRACE_DIR"
TRACE_FLUSH_EVERY = "WORKBOOK_TRACE_FLUSH_EVERY"
EFFECTIVE_DIR = "WORKBOOK_EFFECTIVE_DIR"
WATCH_DIR = "WORKBOOK_WATCH_DIR"  # the start-up watch: options.json in, <pid>/watch.json out
CPU_PROFILE_RUN = "WORKBOOK_CPU_PROFILE_RUN"  # CPU worker runs profile_run (as the GPU one)
ROW_CHECK_DIR = "WORKBOOK_ROW_CHECK_DIR"  # the served grid's row check (hooks.served_rows)
# the fault in these tensor-parallel ranks only ("1", "0,1"; unset: every process): a rank whose
# budget state differs from the others' (docs/parallel.md); set by the caller, inherited by the
# workers, read by the plugin once its rank is known (the runner is built)
FAULT_RANKS = "WORKBOOK_FAULT_RANKS"
HOOK_VARS = (FAULT, GUARD, TRACE_DIR, EFFECTIVE_DIR, WATCH_DIR, CPU_PROFILE_RUN, ROW_CHECK_DIR)
TRITON_CPU = "WORKBOOK_TRITON_CPU"  # workbook.vllm.cpu_shim
DEFAULTS = ("VLLM_TRITON_FORCE_FIRST_CONFIG", "VLLM_CPU_OMP_THREADS_BIND")  # the caller's value wins


def fault_ranks(value: str | None = None) -> set[int] | None:
    """The tensor-parallel ranks ``WORKBOOK_FAULT_RANKS`` names (None: unset, every process);
    ``ValueError`` naming the bad value."""
    raw = os.environ.get(FAULT_RANKS) if value is None else value
    if raw is None or not raw.strip():
        return None
    try:
        out = {int(x) for x in raw.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"{FAULT_RANKS}={raw!r}: must be tensor-parallel ranks, e.g. 1 or 0,1")
    if not out or min(out) < 0:
        raise ValueError(f"{FAULT_RANKS}={raw!r}: must be tensor-parallel ranks >= 0")
    return out


def on_cpu() -> bool:
    """No CUDA device: vLLM's CPU platform (and MRV2 through Triton's interpreter)."""
    import torch

    return not torch.cuda.is_available()


def vllm_env(cfg, *, multiprocess: bool = False, cpu: bool | None = None) -> dict[str, str | None]:
    """Variables vLLM must see before it is imported, for ``cfg``."""
    env: dict[str, str | None] = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
        "VLLM_TRITON_FORCE_FIRST_CONFIG": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
        "VLLM_USE_V2_MODEL_RUNNER": {"v2": "1", "v1": "0", "auto": None}[cfg.runner]}
    if cfg.fault == "H-h":  # workbook.hooks.faults.budget: a V2 run silently served by V1
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if on_cpu() if cpu is None else cpu:
        env[TRITON_CPU] = "1"
        env.update(cpu_parallel_env(cfg))
    return env


CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_parallel_env(cfg) -> dict[str, str]:
    """vLLM's CPU platform with several ranks (``tensor_parallel_size`` x
    ``pipeline_parallel_size`` > 1): its default thread binding (``auto``) binds one NUMA node
    per rank and refuses a one-node machine ("Not enough allowed NUMA nodes to bind threads of
    2 local CPUWorkers"); one core per rank instead (``0|1``), from the cores this process may
    use. The caller's own value wins (``DEFAULTS``)."""
    world = getattr(cfg, "tensor_parallel_size", 1) * getattr(cfg, "pipeline_parallel_size", 1)
    if world <= 1:
        return {}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < world:
        return {}  # workbook.core.config.check_parallel refuses it before any engine starts
    return {CPU_BIND: "|".join(str(c) for c in cores[:world])}


def hook_env(cfg, *, trace_dir: str | None = None, effective_dir: str | None = None,
             watch_dir: str | None = None, flush_every: int | None = None,
             row_check_dir: str | None = None) -> dict[str, str]:
    """Variables that make the plugin install ``cfg``'s hooks in vLLM's processes."""
    env: dict[str, str] = {}
    if getattr(cfg, "row_check", False) and row_check_dir:
        env[ROW_CHECK_DIR] = row_check_dir
    if cfg.fault and cfg.fault != "none":
        env[FAULT] = cfg.fault
    if cfg.guard:
        env[GUARD] = "1"
    if cfg.trace and trace_dir:
        env[TRACE_DIR] = trace_dir
        if flush_every:
            env[TRACE_FLUSH_EVERY] = str(flush_every)
    if effective_dir:
        env[EFFECTIVE_DIR] = effective_dir
    if watch_dir:
        env[WATCH_DIR] = watch_dir
    if getattr(cfg, "cpu_profile_run", False):
        env[CPU_PROFILE_RUN] = "1"
    return env


def apply(env: Mapping[str, str | None], target=None):
    """Write ``env`` into ``target`` (default ``os.environ``); ``None`` unsets a variable."""
    target = os.environ if target is None else target
    for k, v in env.items():
        if v is None:
            target.pop(k, None)
        elif k in DEFAULTS:
            target.setdefault(k, v)
        else:
            target[k] = v
    return target


def prepare_process(cfg) -> None:
    """This process, before ``import vllm``: ``vllm_env`` applied, the CPU shim if needed."""
    apply(vllm_env(cfg))
    if os.environ.get(TRITON_CPU) == "1":
        from workbook.vllm import cpu_shim

        cpu_shim.install()
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()  # an earlier engine cached its env reads; ours may differ


def server_env(cfg, *, trace_dir: str, effective_dir: str, watch_dir: str | None = None,
               base: Mapping[str, str] | None = None,
               row_check_dir: str | None = None) -> dict[str, str]:
    """A ``vllm serve`` subprocess's environment: ours + ``vllm_env`` + ``hook_env``.

    The plugin flushes the trace after every step (the engine process is killed at shutdown).
    """
    env = dict(os.environ if base is None else base)
    apply(vllm_env(cfg, multiprocess=True), env)
    apply(hook_env(cfg, trace_dir=trace_dir, effective_dir=effective_dir, watch_dir=watch_dir,
                   flush_every=1, row_check_dir=row_check_dir), env)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def hooks_requested(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(environ.get(k) for k in HOOK_VARS)
