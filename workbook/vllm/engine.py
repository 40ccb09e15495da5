"""Start vLLM in-process from a ``RunConfig``; the engine arguments a config maps to.

``start(cfg)`` validates, prepares the process environment (``workbook.vllm.env``), builds the
tiny model if one is named, creates ``vllm.LLM`` and returns an ``Engine`` holding the LLM, its
model runner and the *effective* configuration read from the live objects
(``workbook.vllm.effective``). ``engine_kwargs(cfg)`` is the one mapping from a ``RunConfig``
to vLLM's engine arguments (``vllm.LLM`` keywords and ``vllm serve`` flags alike).

While the engine starts, vLLM's start-up output (its logger, Python-level and fd-level
stdout/stderr of this process and of the processes it spawns) goes to a log file
(``start(cfg, log=path)``; default a temporary file) and one summary line is printed instead —
a notebook cell shows that line, not hundreds of log lines. On a failed start the log's tail
is printed.

Not here: the request (``workbook.run.request``), hooks (``workbook.hooks``), the OpenAI
server (``workbook.run.server``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from workbook.core import models
from workbook.core.config import ConfigError, RunConfig, validate
from workbook.vllm import effective, env, hookpoints


def resolve_model(name_or_path: str) -> str:
    return models.build(name_or_path) if models.is_builtin(name_or_path) else name_or_path


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
    if models.is_builtin(cfg.model):
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
    rc = {k: getattr(cfg, k) for k in ("reasoning_start_str", "reasoning_end_str")
          if getattr(cfg, k) is not None}
    if rc:  # --reasoning-config (a dict here; vllm.LLM gets a ReasoningConfig: llm_kwargs)
        kw["reasoning_config"] = rc
    if cfg.logprobs_mode is not None:
        kw["logprobs_mode"] = cfg.logprobs_mode
    if cfg.kv_blocks is not None:
        kw["num_gpu_blocks_override"] = cfg.kv_blocks
    if cfg.tensor_parallel_size != 1:
        kw["tensor_parallel_size"] = cfg.tensor_parallel_size
    if cfg.pipeline_parallel_size != 1:
        kw["pipeline_parallel_size"] = cfg.pipeline_parallel_size
    kw.update(cfg.engine_kwargs)
    return kw


def llm_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """``engine_kwargs`` as ``vllm.LLM`` takes them: its ``reasoning_config`` must be a
    ``vllm.config.ReasoningConfig`` (``LLM`` converts only some config dicts)."""
    kw = engine_kwargs(cfg)
    if isinstance(kw.get("reasoning_config"), dict):
        from vllm.config import ReasoningConfig

        kw["reasoning_config"] = ReasoningConfig(**kw["reasoning_config"])
    return kw


@dataclass
class Engine:
    cfg: RunConfig
    llm: Any
    effective: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    log: str | None = None  # its start-up log (vLLM's output while it started)

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
    driver = getattr(inner.model_executor, "driver_worker", None)
    if driver is None:  # tensor / pipeline parallel: MultiprocExecutor, one worker per rank
        raise RuntimeError("the model runs in vLLM's worker processes (several ranks); the "
                           "plugin reaches their runners (docs/parallel.md)")
    return driver.worker.model_runner


@contextlib.contextmanager
def output_to(path: str):
    """Send this process's stdout/stderr (fds 1 and 2, ``sys.stdout``/``sys.stderr`` and the
    stream handlers of the ``vllm`` loggers) to ``path`` for the duration."""
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    f = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    old_sys = sys.stdout, sys.stderr
    handlers = [h for h in _vllm_stream_handlers()]
    old_streams = [h.setStream(f) for h in handlers]
    try:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.stdout = sys.stderr = f
        yield f
    finally:
        with contextlib.suppress(Exception):
            f.flush()
        sys.stdout, sys.stderr = old_sys
        for h, stream in zip(handlers, old_streams):
            h.setStream(stream)
        for h in _vllm_stream_handlers():  # handlers vLLM created meanwhile (import time)
            if getattr(h, "stream", None) is f:
                h.setStream(old_sys[0])
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        f.close()


def _vllm_stream_handlers() -> list:
    names = ["vllm"] + [n for n in logging.root.manager.loggerDict if n.startswith("vllm.")]
    found = []
    for n in names:
        for h in getattr(logging.getLogger(n), "handlers", []):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) \
                    and h not in found:
                found.append(h)
    return found


def _log_path(log: str | None) -> str:
    if log:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
        return log
    fd, path = tempfile.mkstemp(prefix="workbook-vllm-", suffix=".log")
    os.close(fd)
    return path


def _summary(path: str) -> tuple[int, int]:
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return 0, 0
    return len(lines), sum("WARNING" in re.sub(r"\x1b\[[0-9;]*m", "", ln).split()[:4]
                           for ln in lines if ln.strip())


_MSA_WARMUP = "vllm.model_executor.warmup.minimax_m3_msa_warmup"


def _without_cutedsl_warmup(cfg: RunConfig) -> bool:
    """vLLM 0.34's ``kernel_warmup`` imports its MiniMax-M3 warm-up on every CUDA engine start,
    and that module imports NVIDIA's CuTe DSL (``cutlass``, package nvidia-cutlass-dsl) at
    module level: without that package no model starts (``ModuleNotFoundError: No module named
    'cutlass'``, measured on the H200 with the offline 0.34.0 bundle). The warm-up only plans
    kernels for MiniMax-M3's sparse attention layers, which the workbook's models (Qwen3.5
    shapes, tiny MiMo/Qwen3) do not have; so when ``cutlass`` cannot be imported and the model
    is not a MiniMax one, that one warm-up is replaced by a no-op before the engine starts.
    Returns whether it was; nothing else of vLLM changes, and a version without that module
    is left alone."""
    import importlib.util

    if _MSA_WARMUP in sys.modules or "minimax" in str(cfg.model).lower():
        return False
    try:
        if importlib.util.find_spec(_MSA_WARMUP) is None or \
                importlib.util.find_spec("cutlass") is not None:
            return False
    except (ImportError, ValueError):
        return False
    import types

    mod = types.ModuleType(_MSA_WARMUP)
    mod.minimax_m3_msa_warmup = lambda worker: None
    mod.__doc__ = "workbook: MiniMax-M3 warm-up skipped (no nvidia-cutlass-dsl; not a MiniMax model)"
    sys.modules[_MSA_WARMUP] = mod
    print(f"workbook: {mod.__doc__}", flush=True)
    return True


def start(cfg: RunConfig, log: str | None = None, before_start=None) -> Engine:
    """Validate ``cfg`` and start an in-process vLLM engine; its start-up output goes to
    ``log`` (default: a temporary file), and one line saying so is printed.

    ``before_start()``: called after vLLM is imported and before ``vllm.LLM(...)`` is created
    (pre-start hooks: ``workbook.hooks.pre_start``, so they see the whole start-up)."""
    validate(cfg, on_cpu=env.on_cpu())
    env.prepare_process(cfg)
    path = _log_path(log)
    t0 = time.perf_counter()
    cap = effective.LogCapture()
    try:
        with output_to(path):
            import vllm

            hookpoints.resolve()  # a moved hook point: HookPointError before the engine starts
            _without_cutedsl_warmup(cfg)
            if cfg.async_on_cpu:  # vLLM's CPU platform turns async scheduling off: keep it on
                from workbook.vllm import async_shim

                async_shim.install()
            if before_start is not None:
                before_start()
            t1 = time.perf_counter()
            vlog = logging.getLogger("vllm")
            vlog.addHandler(cap)
            try:
                llm = vllm.LLM(**llm_kwargs(cfg))
            finally:
                vlog.removeHandler(cap)
    except hookpoints.HookPointError:
        raise
    except BaseException as e:
        if not isinstance(e, Exception):  # Ctrl-C, a signal: the caller says it in one line
            raise
        n, _ = _summary(path)
        tail: list = []
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            tail = f.readlines()[-25:]
        why = " ".join(str(e).split())[:300] or "no message"
        print(f"vLLM's engine did not start ({type(e).__name__}: {why}); its log ({n} lines): "
              f"{path}" + ("; last lines:\n" + "".join(tail) if tail else ""), file=sys.stderr)
        raise
    t2 = time.perf_counter()
    try:
        runner = get_runner(llm)
    except RuntimeError:
        runner = None
    eff = effective.effective_config(llm, cap.lines, runner)
    n, warnings = _summary(path)
    runner_name = str(eff.get("runner_class") or "?").rsplit(".", 1)[-1]
    mrv2 = " (Model Runner V2)" if eff.get("runner_is_v2") else \
        " (V1 runner)" if eff.get("runner_is_v2") is False else ""
    spec = f", {cfg.spec_method} k={cfg.num_spec_tokens}" if cfg.spec_method != "none" else ""
    print(f"vLLM {eff.get('vllm_version') or ''} engine started in {t2 - t1:.0f} s: "
          f"{runner_name}{mrv2}{spec}; start-up log ({n} lines, {warnings} warnings): {path}",
          flush=True)
    return Engine(cfg=cfg, llm=llm, effective=eff,
                  timings={"import_s": t1 - t0, "engine_start_s": t2 - t1}, log=path)


_SHARED: dict[str, Engine] = {}


def engine_key(cfg: RunConfig, *extra) -> str:
    """What makes two configs need different engines: the engine arguments and the vLLM-side
    environment (runner choice), plus ``extra`` (e.g. pre-start hooks)."""
    import json

    return json.dumps([engine_kwargs(cfg), env.vllm_env(cfg, cpu=False), *extra],
                      sort_keys=True, default=str)


def shared(cfg: RunConfig, log: str | None = None) -> Engine:
    """An in-process engine for ``cfg``, shared by every config with the same engine arguments
    and the same vLLM-side environment (runner choice): one start per configuration (its
    start-up log in ``log``)."""
    key = engine_key(cfg)
    if key not in _SHARED:
        _SHARED[key] = start(cfg, log)
    return _SHARED[key]


def release(cfg: RunConfig) -> None:
    """Shut down and forget the shared engine of ``cfg`` (``shared``), if one was started: a
    study that starts one engine per configuration in turn (the constraints grid) keeps one
    alive at a time."""
    eng = _SHARED.pop(engine_key(cfg), None)
    if eng is not None:
        eng.shutdown()
