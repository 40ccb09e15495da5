"""Environment files (``environments/<ENV>.yaml``): loaded, merged and validated before any run.

An environment file holds::

    hardware: cpu                      # outputs/<hardware>/...; default: the file's stem
    study: constraints                 # optional: the runs are constraints grids
                                       # (workbook.run.constraints.grid), not notebooks
    notebook: notebooks/01_reproduce.py
    checks: [A]                        # deterministic checks (workbook.run.request), default none
    timeout: 600                       # seconds per run (papermill cell timeout + a hard kill)
    kernel: null                       # Jupyter kernel name; null: the notebook's kernelspec
    executor: papermill-warm           # optional: how `workbook run` executes each run
                                       # (workbook.batch.registry.EXECUTORS; default papermill)
    env: {VLLM_TRITON_FORCE_FIRST_CONFIG: "1"}   # extra environment for the papermill process
    install: |                         # the install recipe this file assumes (recorded only)
      bash setup.sh
    defaults: {model: tiny-mimo-mtp, ...}        # RunConfig fields for every run
    runs:
      - name: reported-mtp             # [A-Za-z0-9._-]+, unique
        spec_method: mtp               # any RunConfig field overrides the defaults (or any
                                       # other parameter the run's notebook declares)
        checks: [A, B]                 # optional: notebook / checks / timeout per run

``load_environment(name, overrides, only=...)`` merges and validates the selected runs (every
run when ``only`` is empty) with exactly the rules the run itself applies
(``workbook.core.config.validate`` with the platform and the run's checks) before anything
starts, raising ``ConfigError`` that names the file, the run and the parameter. ``overrides``
(``--set``) apply to the selected runs only: a run ``--only`` left out is neither changed nor
judged by them (its entry must still be a mapping with a valid, unique name); ``notebook_parameters(spec)`` is what papermill injects
(checked against the notebook's declared parameters). Not here: executing runs
(``workbook.batch.executors``), the batch (``workbook.batch.execute``).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from workbook.core.config import ConfigError, RunConfig, validate
from workbook.core.envfiles import environment_names, find_environment  # noqa: F401 (re-exported)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESERVED = ("name", "notebook", "checks", "timeout", "description")
TOP_KEYS = ("study", "hardware", "notebook", "checks", "timeout", "kernel", "env", "install",
            "description", "defaults", "runs", "executor")
EXECUTOR_NAMES = ("papermill", "papermill-warm", "in-process")  # registry.EXECUTORS
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PLACEHOLDER_RE = re.compile(r"^<.*>$", re.S)


@dataclass
class RunSpec:
    name: str
    notebook: str  # absolute path of the source notebook (.py percent or .ipynb)
    checks: list[str]
    timeout: float
    params: dict[str, Any]  # the full RunConfig of the run + notebook-only parameters
    explicit: dict[str, Any]  # what the file / --set said for this run (defaults included)
    required: list[str] = field(default_factory=list)  # keys the notebook must declare
    description: str = ""


@dataclass
class Environment:
    path: str
    name: str
    hardware: str
    raw: dict[str, Any]
    runs: list[RunSpec] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (self.raw.get("env") or {}).items()}

    @property
    def kernel(self) -> str | None:
        return self.raw.get("kernel")


def _resolve_notebook(nb: str, env_path: str) -> str:
    for root in (os.getcwd(), os.path.dirname(os.path.dirname(env_path)), REPO):
        p = os.path.join(root, nb)
        if os.path.isfile(p):
            return os.path.abspath(p)
    raise ConfigError(f"notebook {nb!r} not found")


def load_environment(name: str, overrides: dict[str, Any] | None = None, *,
                     notebooks: bool = True, only: list[str] | None = None,
                     on_cpu: bool | None = None) -> Environment:
    """Read an environment file and validate its selected runs (``only``; empty: all) as the
    run will (``on_cpu``: the platform, default this machine's); ``overrides`` (``--set``)
    win over all, in the selected runs only. ``env.runs`` holds the selected runs.
    ``notebooks=False``: runs will not execute notebooks (``--in-process``); skip reading them."""
    path = find_environment(name)
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    where = _show(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {list(TOP_KEYS)}")
    if raw.get("executor", "papermill") not in EXECUTOR_NAMES:
        raise ConfigError(f"{where}: executor={raw.get('executor')!r}; choose one of "
                          f"{list(EXECUTOR_NAMES)}")
    stem = os.path.splitext(os.path.basename(path))[0]
    env = Environment(path=path, name=stem, hardware=str(raw.get("hardware") or stem), raw=raw)
    _check_name(env.hardware, f"{where}: hardware")
    if on_cpu is None:
        from workbook.vllm.env import on_cpu as platform_is_cpu

        on_cpu = platform_is_cpu()
    env.runs = plan(raw, path, overrides or {}, notebooks=notebooks, only=only, on_cpu=on_cpu)
    return env


def _show(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{what}={name!r} must match {NAME_RE.pattern}")


def plan(raw: dict[str, Any], path: str, overrides: dict[str, Any], *,
         notebooks: bool = True, only: list[str] | None = None,
         on_cpu: bool | None = None) -> list[RunSpec]:
    """Validated specs of the selected runs (``only``; empty: every run), in file order;
    ``notebooks=False`` (in-process runs) skips the notebook check. ``overrides`` and the
    validation concern the selected runs only; ``on_cpu`` as in ``config.validate``."""
    where = _show(path)
    runs = raw.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"{where}: 'runs' must be a non-empty list")
    defaults = dict(raw.get("defaults") or {})
    specs, seen = [], set()
    for i, entry in enumerate(runs):
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: runs[{i}] must be a mapping")
        name = entry.get("name")
        _check_name(name, f"{where}: runs[{i}].name")
        if name in seen:
            raise ConfigError(f"{where}: run name {name!r} appears twice")
        seen.add(name)
    names = [e["name"] for e in runs]
    unknown = [n for n in only or () if n not in names]
    if unknown:
        raise ConfigError(f"--only {unknown}: no such run in {where}; runs: {names}")
    for entry in runs:
        name = entry["name"]
        if only and name not in only:
            continue
        try:
            specs.append(_spec(raw, path, defaults, entry, overrides, on_cpu))
        except ConfigError as e:
            raise ConfigError(f"{where}, run {name!r}: {e}") from None
    for spec in specs if notebooks else ():  # second pass (reads notebooks), configs valid
        try:
            notebook_parameters(spec)
        except ConfigError as e:
            raise ConfigError(f"{where}, run {spec.name!r}: {e}") from None
    return specs


def _spec(raw, path, defaults, entry, overrides, on_cpu=None) -> RunSpec:
    own = {k: v for k, v in entry.items() if k not in RESERVED}
    merged = {**defaults, **own, **overrides}
    _reject_placeholders(merged)
    fields = set(RunConfig.field_names())
    checks = list(entry.get("checks", raw.get("checks")) or [])
    cfg = validate(RunConfig.from_params(merged), on_cpu=on_cpu, checks=checks)
    timeout = float(entry.get("timeout", raw.get("timeout", 600)))
    if timeout <= 0:
        raise ConfigError(f"timeout={timeout!r} must be > 0 seconds")
    nb = entry.get("notebook", raw.get("notebook", "notebooks/01_reproduce.py"))
    extra = {k: v for k, v in merged.items() if k not in fields}
    return RunSpec(name=entry["name"], notebook=_resolve_notebook(nb, path), checks=checks,
                   timeout=timeout, params={**cfg.to_dict(), **extra}, explicit=merged,
                   required=sorted(set(own) | set(overrides) | set(extra)),
                   description=str(entry.get("description", "")))


def _reject_placeholders(params: dict[str, Any]) -> None:
    for key, value in params.items():
        if isinstance(value, str) and PLACEHOLDER_RE.match(value.strip()):
            raise ConfigError(f"parameter {key} is still the placeholder {value!r}; set it in "
                              f"the environment file or pass --set {key}=VALUE")


_NB_CACHE: dict[str, tuple[Any, dict]] = {}


def read_notebook(path: str):
    """The notebook (jupytext reads ``.py`` percent files) and its declared parameters."""
    if path not in _NB_CACHE:
        import jupytext
        import papermill as pm
        import nbformat

        nb = jupytext.read(path)
        tmp = os.path.join(_scratch(), hashlib.sha256(path.encode()).hexdigest()[:12] + ".ipynb")
        nbformat.write(nb, tmp)
        _NB_CACHE[path] = (tmp, pm.inspect_notebook(tmp))
    return _NB_CACHE[path]


def _scratch() -> str:
    """This process's folder for converted notebooks; removed at exit."""
    import atexit
    import tempfile

    d = os.path.join(tempfile.gettempdir(), f"workbook-batch-{os.getpid()}")
    if not os.path.isdir(d):
        os.makedirs(d)
        atexit.register(_drop_scratch, d)
    return d


def _drop_scratch(d: str) -> None:
    import shutil

    _NB_CACHE.clear()
    shutil.rmtree(d, ignore_errors=True)


def notebook_parameters(spec: RunSpec) -> dict[str, Any]:
    """What papermill injects: the run's parameters the notebook declares, ``checks``.

    A parameter the run (or ``--set``) names, or one that is no RunConfig field, must be
    declared by the notebook; a ``defaults`` field it does not declare is left out.
    """
    _, declared = read_notebook(spec.notebook)
    missing = [k for k in spec.required if k not in declared]
    if spec.checks and "checks" not in declared:
        missing.append("checks")
    unknown = [k for k in spec.required if k not in declared and k not in list(RunConfig.field_names())]
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown}: neither RunConfig fields "
                          f"({list(RunConfig.field_names())}) nor parameters of notebook {_show(spec.notebook)}")
    if missing:
        raise ConfigError(f"notebook {_show(spec.notebook)} declares no parameter(s) "
                          f"{missing}")
    params = {k: v for k, v in spec.params.items() if k in declared}
    if "checks" in declared:
        params["checks"] = list(spec.checks)
    return params


def select(env: Environment, only: list[str] | None) -> list[RunSpec]:
    if not only:
        return list(env.runs)
    names = [r.name for r in env.runs]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--only {unknown}: no such run in {_show(env.path)}; "
                          f"runs: {names}")
    return [r for r in env.runs if r.name in only]
