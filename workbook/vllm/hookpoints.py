"""The MRV2 hook points the workbook patches, resolved for the installed vLLM generation.

Hook points (docs/facts.md), all in ``vllm.v1.worker.gpu``:

    model_runner.GPUModelRunner         .add_requests .sample_tokens .sample .postprocess_sampled
    sample.sampler.Sampler              .add_request .__call__ .apply_sampling_params
    sample.thinking_budget.ThinkingBudgetState   .add_request .apply .apply_staged_writes
    spec_decode.rejection_sampler.RejectionSampler   .__call__ ._verify

API generations met so far (``generation`` below):

- ``"0.28"`` (0.28–0.30): ``ThinkingBudgetState.apply(logits, expanded_idx_mapping, idx_mapping,
  idx_mapping_np, input_ids, expanded_local_pos)``; ``Sampler.add_request(req_idx, prompt_len,
  sampling_params)``; the per-slot gate is written inline in ``Sampler.add_request``.
- ``"0.31"`` (0.31–0.34): ``ThinkingBudgetState.apply(logits, ctx: LogitsContext)``;
  ``Sampler.add_request(req_idx, sampling_params)``; ``ThinkingBudgetState.add_request``
  returns whether the request uses a budget.

``resolve()`` raises ``HookPointError`` naming the first hook point it cannot find, so a vLLM
that moved things fails loudly instead of being traced wrongly.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

PKG = "vllm.v1.worker.gpu"
REQUIRED = {
    "runner": (f"{PKG}.model_runner", "GPUModelRunner",
               ("add_requests", "sample_tokens", "sample", "postprocess_sampled")),
    "sampler": (f"{PKG}.sample.sampler", "Sampler",
                ("add_request", "__call__", "apply_sampling_params")),
    "budget": (f"{PKG}.sample.thinking_budget", "ThinkingBudgetState",
               ("add_request", "apply", "apply_staged_writes")),
    "rejection": (f"{PKG}.spec_decode.rejection_sampler", "RejectionSampler",
                  ("__call__", "_verify")),
}


class HookPointError(RuntimeError):
    """The installed vLLM lacks a hook point the workbook needs."""


@dataclass(frozen=True)
class HookPoints:
    runner: type
    sampler: type
    budget: type
    rejection: type
    generation: str  # "0.28" or "0.31"
    vllm_version: str

    def describe(self) -> dict[str, Any]:
        return {"generation": self.generation, "vllm_version": self.vllm_version,
                **{k: f"{getattr(self, k).__module__}.{getattr(self, k).__qualname__}"
                   for k in REQUIRED}}


def _load(module: str, name: str, attrs: tuple[str, ...], version: str) -> type:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise HookPointError(f"vLLM {version}: hook point module {module} is missing ({e})")
    cls = getattr(mod, name, None)
    if cls is None:
        raise HookPointError(f"vLLM {version}: hook point {module}.{name} is missing")
    for attr in attrs:
        if not hasattr(cls, attr):
            raise HookPointError(f"vLLM {version}: hook point {module}.{name}.{attr} is missing")
    return cls


def generation_of(budget_cls: type, version: str) -> str:
    params = list(inspect.signature(budget_cls.apply).parameters)[1:]
    if params[:2] == ["logits", "ctx"]:
        return "0.31"
    if params[:6] == ["logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np",
                      "input_ids", "expanded_local_pos"]:
        return "0.28"
    raise HookPointError(f"vLLM {version}: hook point ThinkingBudgetState.apply has an unknown "
                         f"signature {params}")


_cache: HookPoints | None = None


def resolve() -> HookPoints:
    global _cache
    if _cache is not None:
        return _cache
    import vllm

    version = vllm.__version__
    classes = {k: _load(m, n, a, version) for k, (m, n, a) in REQUIRED.items()}
    _cache = HookPoints(generation=generation_of(classes["budget"], version),
                        vllm_version=version, **classes)
    return _cache


# --- argument adapters: one small function per generation -------------------------------------

@dataclass
class BudgetApplyArgs:
    logits: Any  # [num_logits, V] float32, modified in place by apply
    expanded_idx_mapping: Any  # [num_logits] logits row -> request slot
    idx_mapping: Any  # [num_reqs] batch index -> request slot
    idx_mapping_np: Any
    input_ids: Any  # [num_logits] the input token at each logits row (drafts at local pos >= 1)
    expanded_local_pos: Any  # [num_logits] position of the row inside its request


def budget_apply_args(generation: str, args: tuple, kwargs: dict) -> BudgetApplyArgs:
    """Normalize ``ThinkingBudgetState.apply``'s arguments (without ``self``)."""
    if generation == "0.31":
        logits = args[0] if args else kwargs["logits"]
        ctx = args[1] if len(args) > 1 else kwargs["ctx"]
        return BudgetApplyArgs(logits, ctx.expanded_idx_mapping, ctx.idx_mapping,
                               ctx.idx_mapping_np, ctx.input_ids, ctx.expanded_local_pos)
    names = ["logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "input_ids",
             "expanded_local_pos"]
    vals = dict(zip(names, args))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    return BudgetApplyArgs(**vals)


def sampler_add_request_params(generation: str, args: tuple, kwargs: dict):
    """(req_idx, sampling_params) of ``Sampler.add_request`` (without ``self``)."""
    if generation == "0.31":
        names = ["req_idx", "sampling_params"]
    else:
        names = ["req_idx", "prompt_len", "sampling_params"]
    vals = dict(zip(names, args))
    vals.update(kwargs)
    return vals["req_idx"], vals["sampling_params"]


@dataclass
class ApplySamplingArgs:
    logits: Any
    expanded_idx_mapping: Any
    idx_mapping: Any
    idx_mapping_np: Any
    pos: Any
    input_ids: Any
    expanded_local_pos: Any


def apply_sampling_args(args: tuple, kwargs: dict) -> ApplySamplingArgs:
    """``Sampler.apply_sampling_params``' leading arguments (same in both generations)."""
    names = ["logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
             "input_ids", "expanded_local_pos"]
    vals = dict(zip(names, args))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    return ApplySamplingArgs(**vals)
