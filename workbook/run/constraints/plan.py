"""The constraints grid's plan: what ``workbook run constraints`` will run, checked before any engine.

``plan(env, overrides, only=..., methods=..., constraints=..., batches=...)``: one ``RunConfig``
per engine from ``environments/constraints.yaml`` (``defaults``, the entry ``only`` names, then
``--set``); ``none`` first (the baseline the cases come from, the differential's reference). Bad
input (unknown constraint, method, batch, entry or parameter; a value vLLM would reject; with
``mode=server`` what a served engine cannot do: ``gridserve.refusals``) raises ``ConfigError``
naming it before any engine starts. ``config_for(method)``: one engine's configuration.
Not here: running the plan (``workbook.run.constraints.grid``), the cases (``workbook.run.constraints.cases``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from workbook.core import contracts, envfiles
from workbook.core.config import ConfigError, RunConfig, validate
from workbook.run.constraints import axes as A
from workbook.run.constraints import cases as C

ENV = "constraints"
REPO = envfiles.REPO
ENTRY_KEYS = ("name", "description", "method", "constraint", "batches", "axes", "vary")
# request fields the grid never reads (its requests are its cases): --set of one is an error
UNUSED = ("thinking_token_budget", "prompt", "top_p", "top_k", "ignore_eos", "enable_thinking",
          "preserve_thinking", "zero_lm_head", "probes", "spec_method")


@dataclass
class Plan:
    base: RunConfig  # defaults + the entry + --set; spec_method is each engine's own
    methods: list[str]  # "none" first
    constraints: list[str]
    batches: list[str]
    name: str = "grid"  # the entry's name, else "grid" (the defaults)
    env_path: str = ""
    hardware: str = "cpu"
    axes: dict = field(default_factory=dict)  # the environment's axes (run.axes.Axis)
    points: list = field(default_factory=lambda: [{}])  # the grid points, default first

    @property
    def fault(self) -> str | None:
        """The fault injected into every engine (a constraint fault, else a budget fault)."""
        return next((f for f in (self.base.constraint_fault, self.base.fault) if f != "none"),
                    None)

    def config(self, method: str, point: dict | None = None) -> RunConfig:
        cfg = A.config(self.base, self.axes, point) if point else self.base
        return cfg.replace(spec_method=method)

    @property
    def spec_only(self) -> tuple[str, ...]:
        return tuple(n for n, a in self.axes.items() if a.spec_only)


find = envfiles.find_environment


def _read(env: str) -> tuple[str, dict]:
    import yaml

    path = find(env)
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return path, raw


def is_grid(env: str) -> bool:
    """Whether environment ``env`` is a constraints study (``study: constraints``)."""
    return _read(env)[1].get("study") == "constraints"


def entries(env: str = ENV) -> list[str]:
    """The names of the environment's entries (``--only`` takes one)."""
    return [r.get("name") for r in _read(env)[1].get("runs") or [] if isinstance(r, dict)]


def _names(value, known, what: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"{what} {bad[0]!r} is unknown; known: {', '.join(known)}")
    return names


def plan(env: str = ENV, overrides: dict | None = None, *, only=None, methods=None,
         constraints=None, batches=None, on_cpu: bool | None = None, axes=None,
         vary: str | None = None) -> Plan:
    """The grid ``env`` (+ the entry ``only`` names, + ``overrides``) asks for; ``methods`` /
    ``constraints`` / ``batches`` / ``axes`` (names, ``NAME=V1,V2`` or a mapping;
    ``run.axes.select``) and ``vary`` replace the entry's. ``ConfigError`` for any bad input,
    an axis value included (every point's configuration is validated)."""
    path, raw = _read(env)
    overrides = dict(overrides or {})
    fields = set(RunConfig.field_names())
    runs = [r for r in raw.get("runs") or [] if isinstance(r, dict)]
    names = [r.get("name") for r in runs]
    only = [only] if isinstance(only, str) else list(only or [])
    if len(only) > 1:
        raise ConfigError(f"--only {only}: one grid per run, name one entry; runs: {names}")
    if only and only[0] not in names:
        raise ConfigError(f"--only {only[0]!r}: no such run in {path}; runs: {names}")
    entry = runs[names.index(only[0])] if only else {}
    defaults = dict(raw.get("defaults") or {})
    for where, d, allowed in (("defaults", defaults, fields),
                              (f"run {entry.get('name')!r}", entry, fields | set(ENTRY_KEYS)),
                              ("--set", overrides, fields)):
        bad = sorted(set(d) - allowed)
        if bad:
            raise ConfigError(f"{where}: unknown parameter(s) {bad}; known: {sorted(allowed)}")
    unused = [k for k in overrides if k in UNUSED]
    if unused:
        raise ConfigError(f"--set {unused[0]}: the grid chooses it per engine (use --methods)"
                          if unused[0] == "spec_method" else f"--set {unused[0]}: the grid "
                          "does not use it (its requests are its cases: "
                          "workbook.run.constraints.cases.case_kwargs)")
    merged = {**defaults, **{k: v for k, v in entry.items() if k in fields}, **overrides}
    if isinstance(merged.get("invariance"), bool):  # YAML reads on / off as booleans
        merged["invariance"] = "on" if merged["invariance"] else "off"
    try:
        base = RunConfig.from_dict(merged)
    except TypeError as e:
        raise ConfigError(str(e)) from None
    from workbook import hooks

    if hooks.needs_pre_start(base) or base.trace:
        raise ConfigError("the grid keeps no trace and no start-up watch (trace, watch, localize, "
                          "sanitize, cpu_profile_run, sampler_warmup, start-up faults are for "
                          "notebook runs: workbook run cpu)")
    if base.temperature != 0:
        raise ConfigError(f"temperature={base.temperature!r}: the grid's cases and its "
                          "differential are greedy; use temperature=0")
    if methods is None:
        methods = [entry["method"]] if entry.get("method") else list(C.METHODS)
    methods = _names(methods, C.METHODS, "method")
    methods = ["none"] + [m for m in dict.fromkeys(methods) if m != "none"]
    if constraints is None:
        c = entry.get("constraint", "all")
        constraints = list(C.CONSTRAINTS) if c == "all" else c
    constraints = list(dict.fromkeys(_names(constraints, C.CONSTRAINTS, "constraint")))
    if batches is None:
        batches = entry.get("batches", list(C.BATCHES))
    batches = list(dict.fromkeys(_names(batches, C.BATCHES, "batch")))
    from workbook.core.models import VOCAB

    for c in constraints:
        try:
            C.validate_case(c, C.case_kwargs(c, [0, 1], lambda ids: "x"), VOCAB)
        except contracts.ContractError as e:
            raise ConfigError(f"constraint {c!r}: {e}") from None
    if on_cpu is None:
        from workbook.vllm import env as wenv

        on_cpu = wenv.on_cpu()
    validate(_checked(base.replace(spec_method="none")), on_cpu=on_cpu)
    for m in methods:
        try:
            validate(_checked(base.replace(spec_method=m)), on_cpu=on_cpu)
        except ConfigError as e:
            raise ConfigError(f"method {m!r}: {e}") from None
    known = A.parse(raw.get("axes"))
    sel = A.select(known, entry.get("axes") if axes is None else axes)
    if base.mode == "server":
        from workbook.run.constraints import served as gridserve

        why = gridserve.refusals(base, batches, sel, next(
            (f for f in (base.constraint_fault, base.fault) if f != "none"), None))
        if why:
            raise ConfigError(f"mode=server: {why}")
    pts = A.points(known, sel, vary or entry.get("vary") or "product")
    why = A.gpu_refusal(known, pts, on_cpu)
    if why:
        raise ConfigError(why)
    for pt in pts:
        if A.unavailable(known, pt):
            continue
        for m in methods:
            if not A.runs_for(m, known, pt):
                continue
            try:
                validate(_checked(A.config(base, known, pt).replace(spec_method=m)), on_cpu=on_cpu)
            except ConfigError as e:
                raise ConfigError(f"axis {A.label(pt)} (method {m!r}): {e}") from None
            except TypeError as e:
                raise ConfigError(f"axis {A.label(pt)}: {e}") from None
    check_engine_kwargs([base] + [A.config(base, known, pt) for pt in pts
                                  if not A.unavailable(known, pt)])
    hardware = str(raw.get("hardware") or os.path.splitext(os.path.basename(path))[0])
    if hardware == "cpu" and on_cpu is False:  # the CPU grid's file run on a GPU host
        hardware = "gpu"
    return Plan(base, methods, constraints, batches, name=entry.get("name", "grid"),
                env_path=path, hardware=hardware, axes=known, points=pts)


def _checked(cfg: RunConfig) -> RunConfig:
    """What ``validate`` checks of a grid engine: over a server the grid's constraint fault is
    switched per batch inside the worker (``hooks.served_rows``), not by the notebook-run
    rule that refuses it there."""
    return cfg.replace(constraint_fault="none", row_check=False) if cfg.mode == "server" \
        else cfg


def engine_arg_names() -> set[str]:
    """The fields of vLLM's ``EngineArgs`` dataclass, read from the installed
    ``vllm/engine/arg_utils.py``'s source (importing vLLM here would disable the CPU shim's
    Triton for the engines this process starts later)."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
        root = os.path.dirname(spec.origin) if spec and spec.origin else None
        with open(os.path.join(root, "engine", "arg_utils.py")) as f:
            tree = ast.parse(f.read())
    except (OSError, TypeError, SyntaxError, ValueError, ImportError):
        return set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            return {st.target.id for st in node.body if isinstance(st, ast.AnnAssign)
                    and isinstance(st.target, ast.Name)}
    return set()


def check_engine_kwargs(cfgs) -> None:
    """``engine_kwargs`` passed through (``--set``, an environment file, an axis) must be
    arguments vLLM's engine takes in-process (``vllm.engine.arg_utils.EngineArgs``' fields):
    ``ConfigError`` naming the first that is not, before any engine starts (vLLM's own
    start-up would fail with a traceback from inside its argument parsing)."""
    names = sorted({k for c in cfgs for k in (c.engine_kwargs or {})})
    if not names:
        return
    known = engine_arg_names()
    if not known:  # no vLLM here: validate() already said so
        return
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"engine_kwargs {bad[0]!r} is not an argument vLLM's engine takes "
                          f"in-process (vllm.engine.arg_utils.EngineArgs has no such field)")


def config_for(method: str, k: int = 3, model: str | None = None) -> RunConfig:
    """The engine configuration of ``method`` in the grid: ``environments/constraints.yaml``'s
    defaults with ``num_spec_tokens=k`` (and ``model`` when given)."""
    over = {"num_spec_tokens": k, **({"model": model} if model else {})}
    return plan(ENV, over, methods=[method], constraints=[], batches=[]).config(method)
