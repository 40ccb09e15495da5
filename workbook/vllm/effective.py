"""The effective configuration: what a live engine really runs, read from its objects.

Not the parameters asked for, but what vLLM chose: runner class (MRV2 or V1), speculator,
samplers, attention backends, async scheduling, eager mode, vLLM version and commit, the
reasoning marker ids (``workbook.core.budget.Markers``) and whether ``ThinkingBudgetState`` is
enabled, plus vLLM's own log lines about runner / backend choices and V2→V1 fallbacks.

- ``effective_config(llm, log_lines)``: an in-process ``vllm.LLM``;
- ``worker_effective(runner)``: inside the process that owns a model runner (the plugin, for
  ``vllm serve``); ``effective_writer(dir)`` writes it on a runner's first requests;
- ``LogCapture`` / ``log_lines_of(path)``: the runner-choice lines, from vLLM's logger or a log
  file; ``v1_fallback_logged(lines)``: the one test for a logged V2→V1 fallback.

Not here: setting the environment (``workbook.vllm.env``), starting engines (``engine``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from workbook.core.budget import Markers
from workbook.core.rundir import write_json
from workbook.vllm import hookpoints, patching

V2_RUNNER_MODULE = "vllm.v1.worker.gpu."
LOG_KEYS = ("Model Runner", "V1", "V2", "fall", "Fall", "backend", "Backend", "speculat",
            "async", "Async", "not supported")


class LogCapture(logging.Handler):
    """Keeps vLLM log lines that tell which runner / backend / fallback was chosen."""


    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # pragma: no cover
            return
        if any(k in msg for k in LOG_KEYS):
            self.lines.append(f"{record.levelname} {record.name}: {msg}"[:500])


def effective_config(llm, log_lines: list[str] | None = None, runner=None) -> dict[str, Any]:
    """What the live engine runs, read from its objects (not from the parameters)."""
    eff = config_facts(llm.llm_engine.vllm_config)
    if runner is not None:
        eff.update(runner_facts(runner))
    eff["log_lines"] = list(log_lines or [])
    eff["v1_fallback_logged"] = v1_fallback_logged(eff["log_lines"])
    return eff


def v1_fallback_logged(lines: list[str]) -> bool:
    """vLLM logged that it fell back from V2 to the V1 runner."""
    return any("V1" in line and ("fall" in line.lower() or "not support" in line.lower())
               for line in lines)


def log_lines_of(path: str, limit: int = 200) -> list[str]:
    """The runner-choice lines of a log file (``vllm serve``'s log)."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip("\n")[:500] for ln in f if any(k in ln for k in LOG_KEYS)]
    except OSError:
        return []
    return lines[:limit]


def config_facts(vcfg) -> dict[str, Any]:
    """Facts of a live ``VllmConfig`` (front-end or worker side): version, scheduler, spec,
    runner choice, reasoning marker ids."""
    import vllm

    spec = vcfg.speculative_config
    rc = getattr(vcfg, "reasoning_config", None)
    eff: dict[str, Any] = {
        "vllm_version": vllm.__version__, "vllm_commit": _vllm_commit(),
        "async_scheduling": bool(vcfg.scheduler_config.async_scheduling),
        "enforce_eager": bool(vcfg.model_config.enforce_eager),
        "dtype": str(vcfg.model_config.dtype), "model": vcfg.model_config.model,
        "architecture": (vcfg.model_config.architectures or [None])[0],
        "use_v2_model_runner": bool(getattr(vcfg, "use_v2_model_runner", False)),
        "env_VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
        "spec_method": getattr(spec, "method", None) if spec else None,
        "num_spec_tokens": getattr(spec, "num_speculative_tokens", 0) if spec else 0}
    if rc is not None:
        eff.update(Markers(getattr(rc, "reasoning_start_token_ids", None) or (),
                           getattr(rc, "reasoning_end_token_ids", None) or (),
                           getattr(rc, "natural_reasoning_end_token_ids", None) or ())
                   .to_effective())
        # the raw natural-end list (empty in the worker is hypothesis H-b's classic cause)
        nat = getattr(rc, "natural_reasoning_end_token_ids", None)
        eff["natural_reasoning_end_token_ids"] = list(nat) if nat is not None else None
    else:
        eff.update({k: None for k in Markers().to_effective()})
    return eff


def runner_facts(runner) -> dict[str, Any]:
    """Runner-side facts (also gathered inside worker processes by the plugin)."""
    cls = type(runner)
    mro = [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]
    facts: dict[str, Any] = {
        "runner_class": mro[0],
        "runner_is_v2": any(m.startswith(V2_RUNNER_MODULE) for m in mro),
        "speculator_class": _qualname(getattr(runner, "speculator", None)
                                      or getattr(runner, "drafter", None)),
        "sampler_class": _qualname(getattr(runner, "sampler", None)),
        "rejection_sampler_class": _qualname(getattr(runner, "rejection_sampler", None)),
        "attention_backends": _attention_backends(runner),
    }
    sampler = getattr(runner, "sampler", None)
    tbs = getattr(sampler, "thinking_budget_state", None)
    facts["thinking_budget_enabled"] = bool(getattr(tbs, "enabled", False)) if tbs else None
    return facts


def _qualname(obj) -> str | None:
    if obj is None:
        return None
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _attention_backends(runner) -> list[str]:
    names: set[str] = set()
    for groups in getattr(runner, "attn_groups", None) or []:
        for g in groups if isinstance(groups, (list, tuple)) else [groups]:
            backend = getattr(g, "backend", None)
            if backend is not None:
                names.add(getattr(backend, "get_name", lambda: backend.__name__)())
    spec = getattr(runner, "speculator", None)
    for groups in getattr(spec, "attn_groups", None) or []:
        for g in groups if isinstance(groups, (list, tuple)) else [groups]:
            backend = getattr(g, "backend", None)
            if backend is not None:
                names.add(getattr(backend, "get_name", lambda: backend.__name__)())
    return sorted(names)


def _vllm_commit() -> str | None:
    try:
        from vllm import _version

        return getattr(_version, "__commit_id__", None) or getattr(_version, "commit_id", None)
    except Exception:
        return None


def worker_effective(runner) -> dict:
    """The keys of ``engine.effective_config``, read inside the process that owns ``runner``.

    (``effective_config`` needs the in-process ``LLM``; this reads the same facts from the
    runner's ``vllm_config``. Log lines are not visible here: ``workbook.run.server`` adds them
    from the server log.)
    """
    eff = config_facts(runner.vllm_config)
    eff["pid"] = os.getpid()
    eff.update(runner_facts(runner))
    return eff


def effective_writer(out_dir: str):
    """Patch set writing ``out_dir/<pid>/effective.json`` once, when a model runner first gets
    requests: MRV2's ``add_requests``, and V1's ``_update_states`` (so a run that silently
    fell back to V1, hypothesis H-h, still says which runner served it)."""
    written: set[int] = set()

    def make(orig):
        def first_requests(runner, *a, **k):
            out = orig(runner, *a, **k)
            if os.getpid() not in written:
                written.add(os.getpid())
                _write_effective(runner, os.path.join(out_dir, str(os.getpid())))
            return out
        return first_requests

    ps = patching.PatchSet("effective", "trace")
    ps.wrap(hookpoints.resolve().runner, "add_requests", make)
    v1 = _v1_runner_class()
    if v1 is not None:
        ps.wrap(v1, "_update_states", make)
    return ps.install()


def _v1_runner_class():
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:  # 0.34+: V1 is gone
        return None
    return GPUModelRunner if hasattr(GPUModelRunner, "_update_states") else None


def _write_effective(runner, folder: str) -> None:
    try:
        eff = worker_effective(runner)
    except Exception as e:  # never break the engine; say what failed instead
        eff = {"error": f"{type(e).__name__}: {e}", "pid": os.getpid()}
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, "effective.json"), eff)
