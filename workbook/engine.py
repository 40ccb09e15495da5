"""Start vLLM in-process from a ``RunConfig`` and read back the configuration it really runs.

``start(cfg)`` validates, sets the environment vLLM reads at import (in-process engine, runner
choice, offline hub, and on a CPU the Triton-interpreter shim), builds the tiny model if one is
named, creates ``vllm.LLM`` and returns an ``Engine`` holding the LLM, its model runner and the
*effective* configuration read from the live objects: runner class, speculator class, attention
backends, async scheduling, V2→V1 fallback lines from vLLM's log, vLLM version and commit, the
reasoning start/end token ids and whether ``ThinkingBudgetState`` is enabled.

Not here: the request (``workbook.request``), hooks (``workbook.trace``, ``faults``, ``guard``),
the OpenAI server (``workbook.server``). One in-process engine per Python process.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from workbook import models
from workbook.config import ConfigError, RunConfig, validate

V2_RUNNER_MODULE = "vllm.v1.worker.gpu."


def base_env(cfg: RunConfig, *, multiprocess: bool = False) -> dict[str, str]:
    """Environment variables vLLM must see before it is imported."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_TRITON_FORCE_FIRST_CONFIG": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0"}
    if cfg.runner == "v2":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    elif cfg.runner == "v1":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if on_cpu():
        env["WORKBOOK_TRITON_CPU"] = "1"
    return env


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def prepare_process(cfg: RunConfig) -> None:
    """Apply ``base_env`` to this process (before ``import vllm``) and the CPU shim if needed."""
    for k, v in base_env(cfg).items():
        if k == "VLLM_TRITON_FORCE_FIRST_CONFIG":
            os.environ.setdefault(k, v)
        else:
            os.environ[k] = v
    if cfg.runner == "auto":
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    if cfg.fault == "H-h":  # workbook.faults: a V2 run silently served by V1
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if os.environ.get("WORKBOOK_TRITON_CPU") == "1":
        from workbook import cpu_shim

        cpu_shim.install()
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()  # an earlier engine cached its env reads; ours may differ


def resolve_model(name_or_path: str) -> str:
    return models.build(name_or_path) if models.is_tiny(name_or_path) else name_or_path


def speculative_config(cfg: RunConfig) -> dict[str, Any] | None:
    k = cfg.num_spec_tokens
    if cfg.spec_method == "none":
        return None
    if cfg.spec_method == "mtp":
        return {"method": "mtp", "num_speculative_tokens": k}
    if cfg.spec_method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 1}
    default_draft = {"eagle": "tiny-llama-eagle", "draft_model": "tiny-qwen2-draft"}
    draft = cfg.draft_model or default_draft.get(cfg.spec_method)
    if draft is None:
        raise ConfigError(f"spec_method={cfg.spec_method!r} needs draft_model (a path)")
    return {"method": cfg.spec_method, "model": resolve_model(draft),
            "num_speculative_tokens": k}


def engine_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (also used to build ``vllm serve`` flags)."""
    kw: dict[str, Any] = dict(model=resolve_model(cfg.model), enforce_eager=cfg.enforce_eager,
                              reasoning_parser=cfg.reasoning_parser,
                              max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                              seed=cfg.seed, dtype=cfg.dtype)
    if models.is_tiny(cfg.model):
        kw["load_format"] = "dummy"
        kw.update(models.model_engine_kwargs(cfg.model))
    spec = speculative_config(cfg)
    if spec is not None:
        kw["speculative_config"] = spec
    if cfg.attention_backend:
        kw["attention_backend"] = cfg.attention_backend
    if cfg.async_scheduling is not None:
        kw["async_scheduling"] = cfg.async_scheduling
    if cfg.kv_cache_bytes is not None:
        kw["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
    if cfg.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    kw.update(cfg.engine_kwargs)
    return kw


class _LogCapture(logging.Handler):
    """Keeps vLLM log lines that tell which runner / backend / fallback was chosen."""

    KEYS = ("Model Runner", "V1", "V2", "fall", "Fall", "backend", "Backend", "speculat",
            "async", "Async", "not supported")

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # pragma: no cover
            return
        if any(k in msg for k in self.KEYS):
            self.lines.append(f"{record.levelname} {record.name}: {msg}"[:500])


@dataclass
class Engine:
    cfg: RunConfig
    llm: Any
    effective: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def runner(self):
        return get_runner(self.llm)

    @property
    def tokenizer(self):
        return self.llm.get_tokenizer()

    def shutdown(self) -> None:
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass


def get_runner(llm):
    """The model runner of an in-process engine (TP=1)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError("the engine runs in another process (VLLM_ENABLE_V1_MULTIPROCESSING=1);"
                           " use the plugin (WORKBOOK_TRACE_DIR) to reach its runner")
    return inner.model_executor.driver_worker.worker.model_runner


def start(cfg: RunConfig) -> Engine:
    """Validate ``cfg`` and start an in-process vLLM engine."""
    validate(cfg)
    prepare_process(cfg)
    t0 = time.perf_counter()
    import vllm

    t1 = time.perf_counter()
    cap = _LogCapture()
    vlog = logging.getLogger("vllm")
    vlog.addHandler(cap)
    try:
        llm = vllm.LLM(**engine_kwargs(cfg))
    finally:
        vlog.removeHandler(cap)
    t2 = time.perf_counter()
    eff = effective_config(llm, cap.lines)
    return Engine(cfg=cfg, llm=llm, effective=eff,
                  timings={"import_s": t1 - t0, "engine_start_s": t2 - t1})


def effective_config(llm, log_lines: list[str] | None = None) -> dict[str, Any]:
    """What the live engine runs, read from its objects (not from the parameters)."""
    eff = config_facts(llm.llm_engine.vllm_config)
    try:
        runner = get_runner(llm)
    except RuntimeError:
        runner = None
    if runner is not None:
        eff.update(runner_facts(runner))
    eff["log_lines"] = list(log_lines or [])
    eff["v1_fallback_logged"] = any("V1" in line and ("fall" in line.lower()
                                                       or "not support" in line.lower())
                                    for line in eff["log_lines"])
    return eff


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
    for key in ("reasoning_start_token_ids", "reasoning_end_token_ids",
                "natural_reasoning_end_token_ids"):
        val = getattr(rc, key, None) if rc is not None else None
        eff[key] = list(val) if val is not None else None
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
