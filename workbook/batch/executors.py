"""Executors: how one run of a batch is executed, chosen by name from ``workbook.batch.registry.EXECUTORS``.

- ``papermill`` (default): the run's notebook executed by ``python -m papermill`` in its own
  process group (executed notebook, ``parameters.yaml``, ``papermill.log``, and the evidence the
  notebook's pipeline writes); a run past its timeout is killed with its kernel and engine.
- ``in-process``: ``workbook.run.pipeline.run`` in this process, engines shared between runs
  with the same engine arguments; no notebooks (hosts without the notebook stack, e.g. the
  offline GPU host). One process cannot kill a run and keep its engine: no per-run timeout.

Each returns the run's manifest row; a failing run gets ``failure.json`` / a failure row with
the failing cell and exception, and the batch goes on. While a run executes, ``on_progress``
(if given) gets a one-line state — the pipeline step now running (``stage.json`` of the run
folder: engine start, request, checks, trace, diagnosis) and the time spent. A signal
(``workbook.batch.signals.Interrupted``) kills the run's process tree and leaves the exception
with the run's row, status ``interrupted``. Not here: the batch loop and manifest
(``workbook.batch.execute``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import traceback
from typing import Any

import yaml

from workbook.batch.environment import REPO, RunSpec, notebook_parameters, read_notebook
from workbook.batch.proctree import MARKER, kill_tree
from workbook.batch.signals import Interrupted
from workbook.core.config import RunConfig
from workbook.core.rundir import FAILURE, now, read_json, write_json
from workbook.run import pipeline

KILL_GRACE_S = 60.0
POLL_S = 1.0
STAGES = {"validate": "validating the configuration", "start": "engine start",
          "request": "the reported request", "check_A": "check A", "check_B": "check B",
          "trace": "reading the trace", "diagnose": "diagnosis", "finish": "finishing"}


def stage_of(folder: str) -> tuple[str | None, float | None]:
    """(the pipeline step a run folder's ``stage.json`` names, seconds since it started)."""
    path = os.path.join(folder, pipeline.STAGE_FILE)
    try:
        st = read_json(path) or {}
        return st.get("stage"), max(0.0, time.time() - os.path.getmtime(path))
    except (OSError, ValueError):
        return None, None


def progress_text(name: str, folder: str, elapsed: float) -> tuple[str, str]:
    """(``run: step``, ``run: step N s (run M s)``): the current run's step and its time."""
    stage, since = stage_of(folder)
    what = STAGES.get(stage, stage) if stage else "starting the kernel"
    key = f"{name}: {what}"
    return key, key + (f" {since:.0f} s" if since is not None else "") + \
        f" (run {elapsed:.0f} s)"


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
    kernel = kernel or fallback_kernel(src)
    if kernel:
        cmd += ["-k", kernel]
    return cmd


def fallback_kernel(ipynb: str) -> str | None:
    """``python3`` when the notebook's kernel (``workbook``, installed by setup.sh) is missing
    here, e.g. on a GPU host set up with ``pip install -e .``; None: use the notebook's."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager

    try:
        name = nbformat.read(ipynb, as_version=4).metadata.get("kernelspec", {}).get("name")
        specs = KernelSpecManager().find_kernel_specs()
    except Exception:
        return None
    if not name or name in specs:
        return None
    return "python3" if "python3" in specs else None


def prepare_run(spec: RunSpec, run_dir: str, timeout: float | None):
    """A papermill run's folder (new: runs never overwrite) and its ``parameters.yaml`` (the
    notebook's ``outdir`` pointed at the folder where it declares one); returns (folder, the
    parameters, the notebook's source, the spec with its timeout resolved)."""
    folder = os.path.join(run_dir, spec.name)
    os.makedirs(folder)
    params = notebook_parameters(spec)
    src, declared = read_notebook(spec.notebook)
    if "outdir" in declared:
        params["outdir"] = folder
    with open(os.path.join(folder, "parameters.yaml"), "w") as f:
        yaml.safe_dump(params, f, sort_keys=True)
    return folder, params, src, dataclasses.replace(spec, timeout=float(timeout or spec.timeout))


def run_papermill(spec: RunSpec, run_dir: str, *, extra_env: dict[str, str], kernel: str | None,
                  timeout: float | None = None, on_progress=None, guard=None) -> dict[str, Any]:
    """Execute one run in its own papermill process; return its manifest row."""
    folder, _, _, spec = prepare_run(spec, run_dir, timeout)
    limit = spec.timeout
    cmd = papermill_command(spec, folder, kernel)
    tag = f"{os.path.abspath(folder)}:{os.getpid()}"
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1", MARKER: tag}
    t0 = time.perf_counter()
    started = now()
    tick = (lambda: on_progress(*progress_text(spec.name, folder,
                                               time.perf_counter() - t0))) if on_progress else None
    with open(os.path.join(folder, "papermill.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        if guard is not None:
            guard.child = (proc.pid, tag)
        try:
            killed = _wait_or_kill(proc, limit + KILL_GRACE_S, tick, tag)
        except Interrupted as e:
            e.row = manifest_row(spec, folder, proc.returncode, False, time.perf_counter() - t0,
                         started, interrupted=e)
            raise
        finally:
            if guard is not None:
                guard.child = None
    wall = time.perf_counter() - t0
    return manifest_row(spec, folder, proc.returncode, killed, wall, started)


def _wait_or_kill(proc: subprocess.Popen, limit: float, tick=None, marker=None) -> bool:
    """Wait up to ``limit`` s (``tick()`` every second); then — or on a signal — kill the run's
    process tree. True: killed for its time limit."""
    deadline = time.monotonic() + limit
    try:
        while True:
            try:
                proc.wait(timeout=max(0.01, min(POLL_S, deadline - time.monotonic())))
                return False
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
            if tick is not None:
                tick()
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid, marker=marker)
        proc.wait()
        return True
    except BaseException:  # a signal (Interrupted) or Ctrl-C: the run is in its own session
        kill_tree(proc.pid, marker=marker)
        proc.wait()
        raise


def manifest_row(spec, folder, rc, killed, wall, started, interrupted=None) -> dict[str, Any]:
    nb_path = executed_path(spec, folder)
    failure = None
    status = "ok" if rc == 0 and not killed else ("timeout" if killed else "failed")
    if interrupted is not None:
        status = "interrupted"
    if status != "ok":
        failure = failure_info(nb_path, folder)
        stage, _ = stage_of(folder)
        failure["stage"] = stage
        if interrupted is not None:
            failure.update(ename="Interrupted",
                           evalue=f"{interrupted.name} received during "
                                  f"{STAGES.get(stage, stage) or 'the kernel start'}, "
                                  f"{wall:.0f} s into the run; the run's processes (papermill, "
                                  "kernel, engine) were stopped")
        elif killed:
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
            "cell_source_head": "\n".join([ln for ln in cell.get("source", "").splitlines()
                                            if ln.strip()][:5]),
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


def run_in_process(spec: RunSpec, run_dir: str, *, extra_env: dict[str, str],
                   kernel: str | None = None, timeout: float | None = None, on_progress=None,
                   guard=None) -> dict[str, Any]:
    """``run_papermill``'s contract (a manifest row), executed in this process."""

    for k, v in extra_env.items():
        os.environ.setdefault(k, v)
    folder = os.path.join(run_dir, spec.name)
    os.makedirs(folder)
    cfg = RunConfig.from_params(spec.params)
    started = now()
    t0 = time.perf_counter()
    failure = None
    on_stage = (lambda stage, _s: on_progress(*progress_text(spec.name, folder,
                                                             time.perf_counter() - t0))) \
        if on_progress else None
    try:
        pipeline.run(cfg, folder, checks=tuple(spec.checks), on_stage=on_stage)
    except Interrupted as e:
        stage, _ = stage_of(folder)
        failure = {"ename": "Interrupted", "stage": stage,
                   "evalue": f"{e.name} received during {STAGES.get(stage, stage)}, "
                             f"{time.perf_counter() - t0:.0f} s into the run",
                   "traceback": None, "cell": None}
        write_json(os.path.join(folder, FAILURE), failure)
        row = manifest_row(spec, folder, 1, False, time.perf_counter() - t0, started)
        row.update(status="interrupted", failure=failure, executed_notebook=None,
                   executor="in-process")
        e.row = row
        raise
    except Exception as e:  # a failing run is a finding; the batch goes on
        failure = {"ename": type(e).__name__, "evalue": str(e)[:2000],
                   "traceback": traceback.format_exc()[-6000:], "cell": None}
        write_json(os.path.join(folder, FAILURE), failure)
    row = manifest_row(spec, folder, 0 if failure is None else 1, False,
                     time.perf_counter() - t0, started)
    row["executed_notebook"] = None
    row["executor"] = "in-process"
    if failure is not None:
        row["failure"] = failure
    return row
