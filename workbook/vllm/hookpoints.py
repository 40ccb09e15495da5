"""The MRV2 hook points the workbook patches, resolved for the installed vLLM generation.

One table (``TABLE``), read two ways: ``resolve()`` imports the installed vLLM's classes and
checks them; ``check_source(root)`` reads a vLLM source tree or wheel without importing it
(a version that cannot run here, e.g. a CUDA wheel on a CPU host). Each hook point names its
module (``modules``: the layouts it has lived in, the first found wins), its class, and per
method the leading parameters the workbook's wrappers read by position or name (``None``: any;
wrappers take the rest as ``*args, **kwargs``). Hook points, all in ``vllm.v1.worker.gpu``
(0.28–0.34):

    model_runner.GPUModelRunner         .add_requests .sample_tokens .sample .postprocess_sampled
    sample.sampler.Sampler              .add_request .__call__ .apply_sampling_params
    sample.thinking_budget.ThinkingBudgetState   .add_request .apply .apply_staged_writes
    spec_decode.rejection_sampler.RejectionSampler   .__call__ ._verify

API generations met so far (``GENERATIONS``; ``generation`` below), told apart by
``ThinkingBudgetState.apply``'s parameters:

- ``"0.28"`` (0.28–0.30): ``ThinkingBudgetState.apply(logits, expanded_idx_mapping, idx_mapping,
  idx_mapping_np, input_ids, expanded_local_pos)``; ``Sampler.add_request(req_idx, prompt_len,
  sampling_params)``; the per-slot gate is written inline in ``Sampler.add_request``.
- ``"0.31"`` (0.31–0.34): ``ThinkingBudgetState.apply(logits, ctx: LogitsContext)``;
  ``Sampler.add_request(req_idx, sampling_params)``; ``ThinkingBudgetState.add_request``
  returns whether the request uses a budget. 0.33 adds ``draft_tokens`` to
  ``postprocess_sampled`` and 0.34 drops ``invalid_drafts`` from ``RejectionSampler.__call__``
  (trailing parameters: wrappers pass them through); 0.34 removes the V1 runner
  (``vllm.v1.worker.gpu_model_runner``), which is not a hook point.

Optional hook points (``OPTIONAL``): module-level functions the tracer and some faults wrap
when present (the budget kernels' launches, the sampling functions); a missing one is listed
by ``describe()`` / ``check_source`` (the tracer then lacks that evidence), never an error.
Optional classes (``OPTIONAL_CLASSES``), the same way: ``sample.prompt_logprob.
PromptLogprobsWorker.compute_prompt_logprobs`` (0.28–0.32; the row check's prompt-logprob
evidence), ``None`` on ``HookPoints`` where missing.

``resolve()`` raises ``HookPointError`` naming the first hook point it cannot find or whose
signature changed, with the vLLM version, so a vLLM that moved things fails loudly instead of
being traced wrongly. ``workbook.vllm.engine.start`` calls it before the engine starts.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import zipfile
from dataclasses import dataclass
from typing import Any

from workbook.core.config import ConfigError

PKG = "vllm.v1.worker.gpu"


@dataclass(frozen=True)
class HookPoint:
    key: str  # attribute of ``HookPoints``
    modules: tuple[str, ...]  # where the class lives, per layout (first found wins)
    cls: str
    methods: dict  # method -> leading parameter names after self (None: any)


TABLE: tuple[HookPoint, ...] = (
    HookPoint("runner", (f"{PKG}.model_runner",), "GPUModelRunner",
              {"add_requests": ("scheduler_output",), "sample_tokens": None,
               "sample": ("hidden_states", "input_batch"),
               "postprocess_sampled": ("idx_mapping",)}),
    HookPoint("sampler", (f"{PKG}.sample.sampler",), "Sampler",
              {"add_request": None,  # per generation (GENERATIONS)
               "__call__": ("logits", "input_batch"),
               "apply_sampling_params": ("logits", "expanded_idx_mapping", "idx_mapping",
                                         "idx_mapping_np", "pos", "input_ids",
                                         "expanded_local_pos")}),
    HookPoint("budget", (f"{PKG}.sample.thinking_budget",), "ThinkingBudgetState",
              {"add_request": ("req_idx", "sampling_params"),
               "apply": None,  # tells the generation (GENERATIONS)
               "apply_staged_writes": ()}),
    HookPoint("rejection", (f"{PKG}.spec_decode.rejection_sampler",), "RejectionSampler",
              {"__call__": ("logits", "input_batch"), "_verify": None}),
)
# optional classes: resolved when present with the parameters named, else None (and listed in
# ``missing_optional``); the evidence that reads them is then absent, never an error
OPTIONAL_CLASSES: tuple[HookPoint, ...] = (
    HookPoint("prompt_logprobs", (f"{PKG}.sample.prompt_logprob",), "PromptLogprobsWorker",
              {"compute_prompt_logprobs": ("logits_fn", "hidden_states", "input_batch")}),
)
REQUIRED = {h.key: (h.modules[0], h.cls, tuple(h.methods)) for h in TABLE}  # older callers
GENERATIONS = {  # generation -> {"key.method": leading parameters}
    "0.31": {"budget.apply": ("logits", "ctx"),
             "sampler.add_request": ("req_idx", "sampling_params")},
    "0.28": {"budget.apply": ("logits", "expanded_idx_mapping", "idx_mapping",
                              "idx_mapping_np", "input_ids", "expanded_local_pos"),
             "sampler.add_request": ("req_idx", "prompt_len", "sampling_params")},
}
OPTIONAL = {  # hook point key whose module holds them -> module-level names
    "budget": ("apply_thinking_budget", "_update_committed_marker_cache_kernel",
               "_thinking_budget_kernel"),
    "sampler": ("gumbel_sample",),
    "rejection": ("rejection_sample",),
}


class HookPointError(ConfigError, RuntimeError):
    """The installed vLLM lacks a hook point the workbook needs (or its signature moved).
    A ``ConfigError``: raised before any engine starts, reported as a configuration error."""


@dataclass(frozen=True)
class HookPoints:
    runner: type
    sampler: type
    budget: type
    rejection: type
    generation: str  # "0.28" or "0.31"
    vllm_version: str
    missing_optional: tuple[str, ...] = ()
    prompt_logprobs: type | None = None  # OPTIONAL_CLASSES (0.28-0.32: PromptLogprobsWorker)

    def describe(self) -> dict[str, Any]:
        return {"generation": self.generation, "vllm_version": self.vllm_version,
                **{h.key: f"{getattr(self, h.key).__module__}."
                          f"{getattr(self, h.key).__qualname__}" for h in TABLE},
                **{h.key: None if getattr(self, h.key) is None else
                   f"{getattr(self, h.key).__module__}.{getattr(self, h.key).__qualname__}"
                   for h in OPTIONAL_CLASSES},
                "missing_optional": list(self.missing_optional)}


def _leading_ok(params: list[str], want: tuple[str, ...] | None) -> bool:
    return want is None or params[:len(want)] == list(want)


def _sig_error(version: str, where: str, params: list[str], want: tuple[str, ...]) -> str:
    return (f"vLLM {version}: hook point {where} changed its signature: parameters "
            f"({', '.join(params)}), the workbook needs them to start with "
            f"({', '.join(want)})")


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)[1:]


def _import_first(h: HookPoint, version: str):
    errors = []
    for module in h.modules:
        try:
            return importlib.import_module(module)
        except ImportError as e:
            errors.append(f"{module} ({e})")
    raise HookPointError(f"vLLM {version}: hook point module for {h.cls} is missing: "
                         f"{'; '.join(errors)}")


def _load(h: HookPoint, version: str) -> type:
    mod = _import_first(h, version)
    cls = getattr(mod, h.cls, None)
    if cls is None:
        raise HookPointError(f"vLLM {version}: hook point {mod.__name__}.{h.cls} is missing")
    for attr, want in h.methods.items():
        where = f"{mod.__name__}.{h.cls}.{attr}"
        if not hasattr(cls, attr):
            raise HookPointError(f"vLLM {version}: hook point {where} is missing")
        if want is not None and not _leading_ok(_params(getattr(cls, attr)), want):
            raise HookPointError(_sig_error(version, where, _params(getattr(cls, attr)), want))
    return cls


def _generation(params_of, version: str) -> str:
    """The generation whose ``budget.apply`` matches; then every other method it pins."""
    apply = params_of("budget", "apply")
    for gen, sigs in GENERATIONS.items():
        if _leading_ok(apply, sigs["budget.apply"]):
            for name, want in sigs.items():
                key, meth = name.split(".")
                got = params_of(key, meth)
                if not _leading_ok(got, want):
                    raise HookPointError(_sig_error(version, f"{_CLS[key]}.{meth}", got, want)
                                         + f" (API generation {gen})")
            return gen
    raise HookPointError(f"vLLM {version}: hook point ThinkingBudgetState.apply has an unknown "
                         f"signature {apply}")


_CLS = {h.key: h.cls for h in TABLE}
LEAF_ORDER = {"budget": 0, "sampler": 1, "rejection": 2, "runner": 3}


def generation_of(budget_cls: type, version: str) -> str:
    params = _params(budget_cls.apply)
    for gen, sigs in GENERATIONS.items():
        if _leading_ok(params, sigs["budget.apply"]):
            return gen
    raise HookPointError(f"vLLM {version}: hook point ThinkingBudgetState.apply has an unknown "
                         f"signature {params}")


_cache: HookPoints | None = None


def resolve() -> HookPoints:
    global _cache
    if _cache is not None:
        return _cache
    import vllm

    version = getattr(vllm, "__version__", "?")
    # leaves first: a class missing from its module is named as such, not as an import error
    # of a module that imports it
    classes = {h.key: _load(h, version)
               for h in sorted(TABLE, key=lambda h: LEAF_ORDER[h.key])}
    gen = _generation(lambda k, m: _params(getattr(classes[k], m)), version)
    missing = tuple(f"{classes[k].__module__}.{name}" for k, names in OPTIONAL.items()
                    for name in names
                    if getattr(importlib.import_module(classes[k].__module__), name, None)
                    is None)
    optional = {}
    for h in OPTIONAL_CLASSES:
        try:
            optional[h.key] = _load(h, version)
        except HookPointError:
            optional[h.key] = None
            missing += (f"{h.modules[0]}.{h.cls}",)
    _cache = HookPoints(generation=gen, vllm_version=version, missing_optional=missing,
                        **classes, **optional)
    return _cache


def forget() -> None:
    """Drop the cached resolution (tests that make a hook point missing)."""
    global _cache
    _cache = None


# --- the same table, read from source without importing vLLM ----------------------------------

def _source_reader(root: str):
    """``read(module) -> source or None`` for a vLLM wheel or a folder holding ``vllm/``."""
    if root.endswith(".whl"):
        z = zipfile.ZipFile(root)
        names = set(z.namelist())

        def read(module):
            for rel in (module.replace(".", "/") + ".py", module.replace(".", "/") +
                        "/__init__.py"):
                if rel in names:
                    return z.read(rel).decode()
            return None
        return read

    def read(module):
        for rel in (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py"):
            path = os.path.join(root, rel)
            if os.path.exists(path):
                with open(path) as f:
                    return f.read()
        return None
    return read


def _source_version(read) -> str:
    src = read("vllm._version") or ""
    for line in src.splitlines():
        if line.startswith(("__version__", "version")) and "=" in line:
            return line.rsplit("=", 1)[1].strip().strip("'\"")
    return "?"


def check_source(root: str) -> dict[str, Any]:
    """The hook-point table against a vLLM source tree or wheel (nothing imported): per hook
    point its module and each method's parameters, the generation, the errors ``resolve()``
    would raise (all of them, not only the first) and the optional names missing."""
    read = _source_reader(root)
    version = _source_version(read)
    out: dict[str, Any] = {"vllm_version": version, "source": root, "points": {},
                           "errors": [], "missing_optional": [], "generation": None}
    params: dict[tuple[str, str], list[str]] = {}
    modules: dict[str, str] = {}
    for h in TABLE:
        module = next((m for m in h.modules if read(m) is not None), None)
        if module is None:
            out["errors"].append(f"vLLM {version}: hook point module for {h.cls} is missing: "
                                 f"{', '.join(h.modules)}")
            continue
        tree = ast.parse(read(module))
        modules[h.key] = module
        top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        top |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                for a in n.names}
        top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
        out["missing_optional"] += [f"{module}.{n}" for n in OPTIONAL.get(h.key, ())
                                    if n not in top]
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == h.cls),
                   None)
        if cls is None:
            out["errors"].append(f"vLLM {version}: hook point {module}.{h.cls} is missing")
            continue
        defs = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef,
                                                              ast.AsyncFunctionDef))}
        assigned = {t.id for n in cls.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Name)}
        point = out["points"][h.key] = {"module": module, "class": h.cls, "methods": {}}
        for meth, want in h.methods.items():
            where = f"{module}.{h.cls}.{meth}"
            f = defs.get(meth)
            if f is None:
                if meth not in assigned:  # inherited or generated: only an import can tell
                    out["errors"].append(f"vLLM {version}: hook point {where} is missing "
                                         "(not defined in the class body)")
                continue
            got = [a.arg for a in f.args.posonlyargs + f.args.args][1:]
            params[(h.key, meth)] = got
            point["methods"][meth] = got
            if want is not None and not _leading_ok(got, want):
                out["errors"].append(_sig_error(version, where, got, want))
    for h in OPTIONAL_CLASSES:
        src = next((read(m) for m in h.modules if read(m) is not None), None)
        tree = ast.parse(src) if src is not None else None
        cls = None if tree is None else next((n for n in tree.body if isinstance(
            n, ast.ClassDef) and n.name == h.cls), None)
        names = set() if cls is None else {f.name for f in cls.body
                                           if isinstance(f, ast.FunctionDef)}
        if not set(h.methods) <= names:
            out["missing_optional"].append(f"{h.modules[0]}.{h.cls}")
    if ("budget", "apply") in params:
        try:
            out["generation"] = _generation(lambda k, m: params.get((k, m), []), version)
        except HookPointError as e:
            out["errors"].append(str(e))
    out["ok"] = not out["errors"]
    return out


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
