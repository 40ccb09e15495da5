"""Start vLLM in-process from a ``RunConfig``; the engine arguments a config maps to.

``start(cfg)`` validates, prepares the process environment (``workbook.vllm.env``), builds the
tiny model if one is named, creates ``vllm.LLM`` and returns an ``Engine`` holding the LLM, its
model runner and the *effective* configuration read from the live objects
(``workbook.vllm.effective``). ``engine_kwargs(cfg)`` is the one mapping from a ``RunConfig``
to vLLM's engine arguments (``vllm.LLM`` keywords and ``vllm serve`` flags alike).

Not here: the request (``workbook.run.request``), hooks (``workbook.hooks``), the OpenAI
server (``workbook.run.server``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from workbook.core import models
from workbook.core.config import ConfigError, RunConfig, validate
from workbook.vllm import effective, env


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


def start(cfg: RunConfig, before_start=None) -> Engine:
    """Validate ``cfg`` and start an in-process vLLM engine.

    ``before_start()``: called after vLLM is imported and before ``vllm.LLM(...)`` is created
    (pre-start hooks: ``workbook.hooks.pre_start``, so they see the whole start-up)."""
    validate(cfg, on_cpu=env.on_cpu())
    env.prepare_process(cfg)
    t0 = time.perf_counter()
    import vllm

    if before_start is not None:
        before_start()
    t1 = time.perf_counter()
    cap = effective.LogCapture()
    vlog = logging.getLogger("vllm")
    vlog.addHandler(cap)
    try:
        llm = vllm.LLM(**engine_kwargs(cfg))
    finally:
        vlog.removeHandler(cap)
    t2 = time.perf_counter()
    try:
        runner = get_runner(llm)
    except RuntimeError:
        runner = None
    eff = effective.effective_config(llm, cap.lines, runner)
    return Engine(cfg=cfg, llm=llm, effective=eff,
                  timings={"import_s": t1 - t0, "engine_start_s": t2 - t1})


_SHARED: dict[str, Engine] = {}


def shared(cfg: RunConfig) -> Engine:
    """An in-process engine for ``cfg``, shared by every config with the same engine arguments
    and the same vLLM-side environment (runner choice): one start per configuration."""
    import json

    key = json.dumps([engine_kwargs(cfg), env.vllm_env(cfg, cpu=False)], sort_keys=True,
                     default=str)
    if key not in _SHARED:
        _SHARED[key] = start(cfg)
    return _SHARED[key]
