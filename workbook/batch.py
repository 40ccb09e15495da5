"""Run a parameter matrix (``environments/<ENV>.yaml``) through papermill, one process per run.

An environment file holds::

    hardware: cpu                      # outputs/<hardware>/...; default: the file's stem
    notebook: notebooks/01_reproduce.py
    checks: [A]                        # deterministic checks (workbook.request), default none
    timeout: 600                       # seconds per run (papermill cell timeout + a hard kill)
    kernel: null                       # Jupyter kernel name; null: the notebook's kernelspec
    env: {VLLM_TRITON_FORCE_FIRST_CONFIG: "1"}   # extra environment for the papermill process
    install: |                         # the install recipe this file assumes (recorded only)
      bash setup.sh
    defaults: {model: tiny-mimo-mtp, ...}        # RunConfig fields for every run
    runs:
      - name: reported-mtp             # [A-Za-z0-9._-]+, unique
        spec_method: mtp               # any RunConfig field overrides the defaults (or any
                                       # other parameter the run's notebook declares)
        checks: [A, B]                 # optional: notebook / checks / timeout per run

``plan(env)`` merges and validates EVERY run (``workbook.config.validate``) before anything
starts, raising ``ConfigError`` that names the file, the run and the parameter. ``execute``
then runs each selected run with ``python -m papermill`` in its own process group into
``<out>/<hardware>/<run-id>/<name>/`` (executed notebook, ``parameters.yaml``,
``papermill.log`` and the evidence files ``investigate.run`` writes there). The run-level folder
gets ``environment.json``, ``manifest.json`` (rewritten after every run, so a killed batch still
has one), ``report.html`` and ``SHA256SUMS`` (last, over every file). A run-id is a fresh
timestamp plus a random suffix, created with ``mkdir`` that refuses an existing folder: nothing
is ever overwritten. ``--in-process`` swaps the papermill runner for ``workbook.inprocess``.

Not here: the notebook itself, the engine, reports (``workbook.report``), argument parsing
(``workbook.cli``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from workbook.config import ConfigError, RunConfig, validate
from workbook.investigate import read_json, write_json  # noqa: F401  (also batch's API)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESERVED = ("name", "notebook", "checks", "timeout", "description")
TOP_KEYS = ("hardware", "notebook", "checks", "timeout", "kernel", "env", "install",
            "description", "defaults", "runs")
CHECKS = ("A", "B")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PLACEHOLDER_RE = re.compile(r"^<.*>$", re.S)
KILL_GRACE_S = 60.0
SUMS = "SHA256SUMS"
REPORT = "report.html"


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


# ---------------------------------------------------------------- loading and validation

def find_environment(name: str) -> str:
    """``cpu`` → ``environments/cpu.yaml`` (cwd first, then the repository); or a path."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    for root in (os.getcwd(), REPO):
        p = os.path.join(root, "environments", f"{name}.yaml")
        if os.path.isfile(p):
            return p
    raise ConfigError(f"no environment {name!r}: neither a file nor environments/{name}.yaml")


def _resolve_notebook(nb: str, env_path: str) -> str:
    for root in (os.getcwd(), os.path.dirname(os.path.dirname(env_path)), REPO):
        p = os.path.join(root, nb)
        if os.path.isfile(p):
            return os.path.abspath(p)
    raise ConfigError(f"notebook {nb!r} not found")


def load_environment(name: str, overrides: dict[str, Any] | None = None, *,
                     notebooks: bool = True) -> Environment:
    """Read and fully validate an environment file; ``overrides`` (``--set``) win over all.
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
    stem = os.path.splitext(os.path.basename(path))[0]
    env = Environment(path=path, name=stem, hardware=str(raw.get("hardware") or stem), raw=raw)
    _check_name(env.hardware, f"{where}: hardware")
    env.runs = plan(raw, path, overrides or {}, notebooks=notebooks)
    return env


def _show(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{what}={name!r} must match {NAME_RE.pattern}")


def plan(raw: dict[str, Any], path: str, overrides: dict[str, Any], *,
         notebooks: bool = True) -> list[RunSpec]:
    """Validated run specs; ``notebooks=False`` (in-process runs) skips the notebook check."""
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
        try:
            specs.append(_spec(raw, path, defaults, entry, overrides))
        except ConfigError as e:
            raise ConfigError(f"{where}, run {name!r}: {e}") from None
    for spec in specs if notebooks else ():  # second pass (reads notebooks), configs valid
        try:
            notebook_parameters(spec)
        except ConfigError as e:
            raise ConfigError(f"{where}, run {spec.name!r}: {e}") from None
    return specs


def _spec(raw, path, defaults, entry, overrides) -> RunSpec:
    own = {k: v for k, v in entry.items() if k not in RESERVED}
    merged = {**defaults, **own, **overrides}
    _reject_placeholders(merged)
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    cfg = validate(RunConfig.from_dict({k: v for k, v in merged.items() if k in fields}))
    checks = list(entry.get("checks", raw.get("checks")) or [])
    bad = [c for c in checks if c not in CHECKS]
    if bad:
        raise ConfigError(f"checks={checks!r}: unknown {bad}; choose from {list(CHECKS)}")
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


# ---------------------------------------------------------------- notebooks

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


def _fields() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


def notebook_parameters(spec: RunSpec) -> dict[str, Any]:
    """What papermill injects: the run's parameters the notebook declares, ``checks``.

    A parameter the run (or ``--set``) names, or one that is no RunConfig field, must be
    declared by the notebook; a ``defaults`` field it does not declare is left out.
    """
    _, declared = read_notebook(spec.notebook)
    missing = [k for k in spec.required if k not in declared]
    if spec.checks and "checks" not in declared:
        missing.append("checks")
    unknown = [k for k in spec.required if k not in declared and k not in _fields()]
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown}: neither RunConfig fields "
                          f"({_fields()}) nor parameters of notebook {_show(spec.notebook)}")
    if missing:
        raise ConfigError(f"notebook {_show(spec.notebook)} declares no parameter(s) "
                          f"{missing}")
    params = {k: v for k, v in spec.params.items() if k in declared}
    if "checks" in declared:
        params["checks"] = list(spec.checks)
    return params


# ---------------------------------------------------------------- run folders

def new_run_dir(out: str, hardware: str) -> tuple[str, str]:
    """A fresh ``<out>/<hardware>/<run-id>``; never an existing one."""
    base = os.path.join(out, hardware)
    os.makedirs(base, exist_ok=True)
    while True:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        run_id = f"{stamp}-{secrets.token_hex(3)}"
        path = os.path.join(base, run_id)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return run_id, path


# ---------------------------------------------------------------- one run

def executed_path(spec: RunSpec, folder: str) -> str:
    return os.path.join(folder, os.path.splitext(os.path.basename(spec.notebook))[0] + ".ipynb")


def papermill_command(spec: RunSpec, folder: str, kernel: str | None) -> list[str]:
    """``python -m papermill``: cell timeout = the run's timeout (a hard kill follows later)."""
    src, _ = read_notebook(spec.notebook)
    out_nb = executed_path(spec, folder)
    cmd = [sys.executable, "-m", "papermill", src, out_nb, "-f",
           os.path.join(folder, "parameters.yaml"), "--cwd", folder,
           "--execution-timeout", str(int(spec.timeout)), "--no-progress-bar",
           "--log-level", "INFO"]
    if kernel:
        cmd += ["-k", kernel]
    return cmd


def run_one(spec: RunSpec, run_dir: str, *, extra_env: dict[str, str], kernel: str | None,
            timeout: float | None = None) -> dict[str, Any]:
    """Execute one run in its own papermill process; return its manifest row."""
    folder = os.path.join(run_dir, spec.name)
    os.makedirs(folder)
    params = notebook_parameters(spec)
    _, declared = read_notebook(spec.notebook)
    if "outdir" in declared:
        params["outdir"] = folder
    with open(os.path.join(folder, "parameters.yaml"), "w") as f:
        yaml.safe_dump(params, f, sort_keys=True)
    limit = float(timeout or spec.timeout)
    spec = dataclasses.replace(spec, timeout=limit)
    cmd = papermill_command(spec, folder, kernel)
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    started = _now()
    with open(os.path.join(folder, "papermill.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        killed = _wait_or_kill(proc, limit + KILL_GRACE_S)
    wall = time.perf_counter() - t0
    return _row(spec, folder, proc.returncode, killed, wall, started)


def _wait_or_kill(proc: subprocess.Popen, limit: float) -> bool:
    """Wait up to ``limit`` s; then (or on Ctrl-C) kill the run's process tree. True: killed."""
    try:
        proc.wait(timeout=limit)
        return False
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
        return True
    except BaseException:  # KeyboardInterrupt: the run is in its own session, end it too
        kill_tree(proc.pid)
        proc.wait()
        raise


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and every descendant (the kernel, vLLM's engine processes), by id."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def _now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _row(spec, folder, rc, killed, wall, started) -> dict[str, Any]:
    nb_path = executed_path(spec, folder)
    failure = None
    status = "ok" if rc == 0 and not killed else ("timeout" if killed else "failed")
    if status != "ok":
        failure = failure_info(nb_path, folder)
        if killed:
            failure.update(ename="Killed",
                           evalue=f"run exceeded {spec.timeout:.0f} s (+{KILL_GRACE_S:.0f} s "
                                  "grace); killed with its kernel and engine processes")
        elif (failure.get("ename") or "").endswith("TimeoutError"):
            status = "timeout"
    evidence = {n: read_json(os.path.join(folder, f"{n}.json"))
                for n in ("timings", "verdict", "outcome")}
    return {"name": spec.name, "description": spec.description,
            "notebook": os.path.relpath(spec.notebook, REPO), "path": spec.name,
            "executed_notebook": os.path.basename(nb_path), "status": status,
            "returncode": rc, "started": started, "wall_s": round(wall, 3),
            "timeout_s": spec.timeout, "checks": spec.checks, "params": spec.explicit,
            "config": spec.params, "timings": evidence["timings"],
            "verdict": evidence["verdict"], "outcome": _outcome_summary(evidence["outcome"]),
            "failure": failure}


def _outcome_summary(outcomes) -> dict[str, Any] | None:
    if not outcomes:
        return None
    o = outcomes[0]
    keys = ("finish_reason", "completion_tokens", "reasoning_tokens", "content", "first_token",
            "first_token_text", "expected_end_index", "actual_end_index", "honored")
    return {k: o.get(k) for k in keys}


def failure_info(nb_path: str, folder: str) -> dict[str, Any]:
    """Why a run failed: the failing cell of the partial notebook + papermill's exception.

    The kernel-side exception (an error output) wins, except after a cell timeout (the kernel
    then may show the ``KeyboardInterrupt`` it was stopped with); otherwise (dead kernel, kill)
    the exception papermill itself died with, read from ``papermill.log``. ``cell_index``
    counts the cells of the executed notebook (papermill's injected cells included).
    """
    cell = failing_cell(nb_path) or {}
    log = exception_from_log(os.path.join(folder, "papermill.log"))
    first = log if (log.get("ename") or "").endswith("TimeoutError") else cell  # the cause
    info = {"ename": first.get("ename") or cell.get("ename") or log.get("ename"),
            "evalue": first.get("evalue") or cell.get("evalue") or log.get("evalue"),
            "runner_exception": log.get("ename"), "kernel_exception": cell.get("ename"),
            "cell_index": cell.get("cell_index"),
            "cell_id": cell.get("cell_id"), "cell_source_head": cell.get("cell_source_head"),
            "traceback_tail": cell.get("traceback_tail"), "log_tail": log.get("log_tail")}
    return info


def failing_cell(path: str) -> dict[str, Any] | None:
    """The cell that failed in a (partially) executed notebook, with its error if it has one.

    In order: a cell with an error output; a cell papermill marked ``running`` (killed); the
    last cell that started (papermill marks every cell ``completed`` after a cell timeout).
    """
    if not os.path.exists(path):
        return None
    import nbformat

    cells = nbformat.read(path, as_version=4).cells
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return _cell_info(i, cell, out)
    pm = [c.get("metadata", {}).get("papermill", {}) for c in cells]
    running = [i for i, m in enumerate(pm) if m.get("status") == "running"]
    started = [i for i, m in enumerate(pm) if m.get("start_time")]
    idx = running[0] if running else (started[-1] if started else None)
    return None if idx is None else _cell_info(idx, cells[idx], None)


def _cell_info(i: int, cell, err) -> dict[str, Any]:
    err = err or {}
    return {"ename": err.get("ename"), "evalue": _strip_ansi(str(err.get("evalue")))[:2000]
            if err.get("evalue") is not None else None,
            "cell_index": i, "cell_id": cell.get("id"),
            "cell_source_head": "\n".join(cell.get("source", "").splitlines()[:5]),
            "traceback_tail": _strip_ansi("\n".join(err.get("traceback", [])))[-3000:] or None}


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")


def exception_from_log(path: str) -> dict[str, Any]:
    """The exception papermill's own process died with (from its last traceback), log tail.

    The header line after the last column-0 ``Traceback`` names it; a multi-line message
    (``PapermillExecutionError`` embeds the kernel's traceback) is not searched further.
    """
    if not os.path.exists(path):
        return {}
    with open(path, errors="replace") as f:
        lines = [_strip_ansi(ln.rstrip()) for ln in f if ln.strip()]
    tail = "\n".join(lines[-30:])
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call")]
    for line in lines[starts[-1] + 1:] if starts else []:
        m = _EXC_LINE.match(line)
        if m:
            return {"ename": m.group(1).rsplit(".", 1)[-1], "evalue": m.group(2) or None,
                    "log_tail": tail}
    return {"log_tail": tail}


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)


# ---------------------------------------------------------------- the batch

def execute(env: Environment, *, out: str = "outputs", only: list[str] | None = None,
            timeout: float | None = None, progress: bool = True, report: bool = True,
            on_run: Callable[[dict], None] | None = None, run_fn: Callable | None = None) -> str:
    """Run the (selected) runs of an already validated environment; return the run folder.

    With ``report``, the folder also gets ``report.html`` (``workbook.report``) over this batch
    before ``SHA256SUMS`` is written (a failing report never costs the checksums).
    ``run_fn`` replaces the papermill runner (``workbook.inprocess.run_one``: one process).
    """
    runs = select(env, only)
    out = os.path.abspath(out)  # papermill runs with --cwd <run folder>: no relative outdir
    from workbook import envcapture

    probes = envcapture.start()
    run_id, run_dir = new_run_dir(out, env.hardware)
    manifest = _manifest_head(env, run_id, runs, timeout)
    write_json(os.path.join(run_dir, "manifest.json"), manifest)
    bar = _progress(len(runs), env.name, progress)
    try:
        for spec in runs:
            bar.set_postfix_str(spec.name)
            row = (run_fn or run_one)(spec, run_dir, extra_env=env.env, kernel=env.kernel,
                                      timeout=timeout)
            manifest["runs"].append(row)
            write_json(os.path.join(run_dir, "manifest.json"), manifest)
            bar.write(_line(row))
            bar.update(1)
            if on_run:
                on_run(row)
    finally:
        bar.close()
        environment = envcapture.capture(REPO, probes)
        environment["install"] = env.raw.get("install")
        write_json(os.path.join(run_dir, "environment.json"), environment)
        _close_manifest(manifest, run_dir)
        try:
            if report:
                from workbook import report as rep

                rep.write([run_dir], os.path.join(run_dir, REPORT))
        finally:
            write_sums(run_dir)
    return run_dir


def select(env: Environment, only: list[str] | None) -> list[RunSpec]:
    if not only:
        return list(env.runs)
    names = [r.name for r in env.runs]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--only {unknown}: no such run in {_show(env.path)}; "
                          f"runs: {names}")
    return [r for r in env.runs if r.name in only]


def _manifest_head(env, run_id, runs, timeout) -> dict[str, Any]:
    from workbook import envcapture

    rel = os.path.relpath(env.path, REPO)
    return {"environment": env.name,
            "environment_file": env.path if rel.startswith("..") else rel,
            "environment_sha256": file_sha256(env.path), "hardware": env.hardware,
            "run_id": run_id, "started": _now(), "finished": None, "status": "running",
            "planned": [r.name for r in runs], "timeout_override_s": timeout,
            "workbook_git": envcapture.git_commit(REPO), "argv": sys.argv, "runs": []}


def _close_manifest(manifest, run_dir) -> None:
    rows = manifest["runs"]
    manifest["finished"] = _now()
    done = len(rows) == len(manifest["planned"])
    manifest["status"] = ("ok" if done and all(r["status"] == "ok" for r in rows)
                          else "failed" if rows else "aborted")
    manifest["counts"] = {s: sum(r["status"] == s for r in rows)
                          for s in ("ok", "failed", "timeout")}
    manifest["verdicts"] = {r["name"]: (r.get("verdict") or {}).get("verdict") for r in rows}
    write_json(os.path.join(run_dir, "manifest.json"), manifest)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, file=sys.stderr,
                dynamic_ncols=True)


def _line(row: dict) -> str:
    v = (row.get("verdict") or {}).get("verdict", "-")
    msg = f"{row['name']}: {row['status']} in {row['wall_s']:.0f} s, verdict {v}"
    if row.get("failure"):
        f = row["failure"]
        msg += f" ({f.get('ename')}: {str(f.get('evalue'))[:120]})"
    return msg


# ---------------------------------------------------------------- checksums

def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(run_dir: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(run_dir):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), run_dir)
            if rel != SUMS:
                found.append(rel.replace(os.sep, "/"))
    return sorted(found)


def write_sums(run_dir: str) -> str:
    """``SHA256SUMS`` in ``sha256sum`` format: every file of the run folder."""
    lines = [f"{file_sha256(os.path.join(run_dir, rel))}  {rel}\n" for rel in list_files(run_dir)]
    path = os.path.join(run_dir, SUMS)
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)
    return path


def verify(run_dir: str) -> list[str]:
    """Problems found (empty: every file matches and none is missing or unlisted)."""
    path = os.path.join(run_dir, SUMS)
    if not os.path.exists(path):
        return [f"{SUMS} missing in {run_dir}"]
    listed = {}
    with open(path) as f:
        for line in f:
            digest, _, rel = line.rstrip("\n").partition("  ")
            listed[rel] = digest
    problems = []
    for rel, digest in sorted(listed.items()):
        p = os.path.join(run_dir, rel)
        if not os.path.exists(p):
            problems.append(f"missing: {rel}")
        elif file_sha256(p) != digest:
            problems.append(f"changed: {rel}")
    problems += [f"not listed: {rel}" for rel in list_files(run_dir) if rel not in listed]
    return problems


# ---------------------------------------------------------------- finding runs

def latest_runs(out: str = "outputs") -> list[str]:
    """The newest run folder (one with a manifest) of each hardware under ``out``."""
    found = []
    if not os.path.isdir(out):
        return found
    for hw in sorted(os.listdir(out)):
        base = os.path.join(out, hw)
        if not os.path.isdir(base):
            continue
        runs = sorted(d for d in os.listdir(base)
                      if os.path.isfile(os.path.join(base, d, "manifest.json")))
        if runs:
            found.append(os.path.join(base, runs[-1]))
    return found
