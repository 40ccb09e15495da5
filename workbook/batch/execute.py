"""Run a validated environment's matrix into a fresh batch folder; the manifest and checksums.

``execute(env, out=..., executor="papermill")`` creates ``<out>/<hardware>/<run-id>/``
(``workbook.core.rundir.new_run_dir``: never an existing one), writes ``manifest.json`` at
once (``status: running``) and after every run, runs each selected run with the executor of
``workbook.batch.registry.EXECUTORS`` (its executed notebook also rendered to HTML next to
it, ``workbook.batch.nbhtml``), then writes ``environment.json``
(``workbook.batch.envcapture``), closes the manifest, writes ``report.html``
with the report writer its caller passes (the CLI passes ``workbook.report.write``) and, last, ``SHA256SUMS`` over every file.

Signals (``workbook.batch.signals``): SIGINT / SIGTERM / SIGHUP stop the current run with its
processes, record its failure row (status ``interrupted``), close the manifest (status
``interrupted``, with ``interrupted: {signal, run, at}`` and the runs never started) and write
the report and ``SHA256SUMS``; the caller reads the manifest for the exit code (128 + signal).
A second signal forces an exit, leaving the folder unfinished.

The progress bar (``workbook.core.progress``, the one every long command draws) shows the
current run's pipeline step and its time (``executors``) when ``progress`` is on (``workbook run`` turns it on for a terminal only); either way each finished
run gets one line on stderr. Not
here: loading the environment (``environment``), running one run (``executors``), argument
parsing (``cli``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from workbook.batch import signals
from workbook.batch.environment import REPO, Environment, select
from workbook.batch.registry import EXECUTORS
from workbook.core.progress import Progress
from workbook.core.rundir import (MANIFEST, REPORT, file_sha256, new_run_dir, now, write_json,
                                  write_sums)


def execute(env: Environment, *, out: str = "outputs", only: list[str] | None = None,
            timeout: float | None = None, progress: bool = True,
            report: Callable[[list[str], str], object] | None = None,
            on_run: Callable[[dict], None] | None = None, executor: str = "papermill",
            hide_code: bool = False, notebook_html: bool = True,
            on_start: Callable[[str], None] | None = None) -> str:
    """Run the (selected) runs of an already validated environment; return the run folder.

    ``report(run_dirs, path)`` (the layer above passes ``workbook.report.write``; imports point
    one way) writes ``report.html`` over this batch before ``SHA256SUMS`` is written (a failing
    report never costs the checksums); ``None``: no report.
    ``executor`` names the run executor (``workbook.batch.registry.EXECUTORS``);
    ``notebook_html`` renders each executed notebook to HTML (``hide_code``: without code).
    ``on_start(run_dir)`` is called once the folder exists.
    """
    runs = select(env, only)
    out = os.path.abspath(out)  # papermill runs with --cwd <run folder>: no relative outdir
    from workbook.batch import envcapture

    probes = envcapture.start()
    run_id, run_dir = new_run_dir(out, env.hardware)
    manifest = _manifest_head(env, run_id, runs, timeout)
    write_json(os.path.join(run_dir, MANIFEST), manifest)
    if on_start:
        on_start(run_dir)
    interrupted: signals.Interrupted | None = None
    with signals.Guard(run_dir) as guard:
        bar = _progress(len(runs), env.name, progress)
        try:
            for spec in runs:
                guard.current = spec.name
                bar.set_postfix_str(spec.name)
                row = EXECUTORS[executor](spec, run_dir, extra_env=env.env, kernel=env.kernel,
                                          timeout=timeout, on_progress=bar.stage, guard=guard)
                guard.current = None
                manifest["runs"].append(row)  # recorded before the render: a signal there
                write_json(os.path.join(run_dir, MANIFEST), manifest)  # keeps the row
                _notebook_html(run_dir, row, notebook_html, hide_code)
                write_json(os.path.join(run_dir, MANIFEST), manifest)  # with its HTML link
                bar.done(_line(row))
                if on_run:
                    on_run(row)
        except signals.Interrupted as e:
            interrupted = e
            if e.row is None and e.run and e.run not in {r["name"] for r in manifest["runs"]}:
                spec = next(r for r in runs if r.name == e.run)
                e.row = {"name": e.run, "path": e.run, "status": "interrupted", "wall_s": 0.0,
                         "config": spec.params, "params": spec.explicit, "checks": spec.checks,
                         "executed_notebook": None, "verdict": None, "outcome": None,
                         "failure": {"ename": "Interrupted", "stage": None,
                                     "evalue": f"{e.name} received before the run started"}}
            if e.row is not None:
                manifest["runs"].append(e.row)
                bar.done(_line(e.row))
            manifest["interrupted"] = {"signal": e.name, "run": e.run, "at": now()}
            write_json(os.path.join(run_dir, MANIFEST), manifest)
        finally:
            bar.close()
            with guard.optional():  # e.g. the warm kernel and its engines (papermill-warm)
                getattr(EXECUTORS[executor], "close", lambda: None)()
        guard.closing = True
        environment: dict[str, Any] = {"interrupted": True}
        with guard.optional():
            if interrupted is not None and interrupted.row is not None:
                _notebook_html(run_dir, interrupted.row, notebook_html, hide_code)
            if interrupted is not None:
                print("workbook: closing the run folder (environment probes: up to 15 s; "
                      "again to force)", file=sys.stderr, flush=True)
            environment = envcapture.capture(REPO, probes,
                                             timeout=15.0 if interrupted else 120.0)
        environment["install"] = env.raw.get("install")
        write_json(os.path.join(run_dir, "environment.json"), environment)
        _close_manifest(manifest, run_dir)
        if report is not None and not (guard.received and interrupted is None):
            with guard.optional():
                try:
                    report([run_dir], os.path.join(run_dir, REPORT))
                except Exception as e:  # the checksums come first
                    print(f"workbook: the report failed: {type(e).__name__}: {e}",
                          file=sys.stderr)
        write_sums(run_dir)
    return run_dir


def _notebook_html(run_dir: str, row: dict, enabled: bool, hide_code: bool) -> None:
    """The run's executed notebook as HTML next to it (best effort: never fails a batch)."""
    nb = row.get("executed_notebook")
    if not enabled or not nb:
        return
    ipynb = os.path.join(run_dir, row.get("path") or row["name"], nb)
    if not os.path.exists(ipynb):
        return
    try:
        from workbook.batch import nbhtml

        nbhtml.render(ipynb, os.path.splitext(ipynb)[0] + ".html", hide_code=hide_code)
        row["notebook_html"] = os.path.splitext(nb)[0] + ".html"
    except Exception as e:
        row["notebook_html_error"] = f"{type(e).__name__}: {e}"[:500]


def _manifest_head(env, run_id, runs, timeout) -> dict[str, Any]:
    from workbook.batch import envcapture

    rel = os.path.relpath(env.path, REPO)
    return {"environment": env.name,
            "environment_file": env.path if rel.startswith("..") else rel,
            "environment_sha256": file_sha256(env.path), "hardware": env.hardware,
            "run_id": run_id, "started": now(), "finished": None, "status": "running",
            "planned": [r.name for r in runs], "timeout_override_s": timeout,
            "workbook_git": envcapture.git_commit(REPO), "argv": sys.argv, "runs": []}


def _close_manifest(manifest, run_dir) -> None:
    rows = manifest["runs"]
    manifest["finished"] = now()
    done = len(rows) == len(manifest["planned"])
    if manifest.get("interrupted"):
        manifest["status"] = "interrupted"
        ran = {r["name"] for r in rows}
        manifest["not_started"] = [n for n in manifest["planned"] if n not in ran]
    else:
        manifest["status"] = ("ok" if done and all(r["status"] == "ok" for r in rows)
                              else "failed" if rows else "aborted")
    manifest["counts"] = {s: sum(r["status"] == s for r in rows)
                          for s in ("ok", "failed", "timeout", "interrupted")}
    manifest["verdicts"] = {r["name"]: (r.get("verdict") or {}).get("verdict") for r in rows}
    write_json(os.path.join(run_dir, MANIFEST), manifest)


def _progress(total: int, desc: str, enabled: bool) -> Progress:
    return Progress(total, desc, enabled, unit="run")


def _line(row: dict) -> str:
    v = (row.get("verdict") or {}).get("verdict", "-")
    msg = f"{row['name']}: {row['status']} in {row['wall_s']:.0f} s, verdict {v}"
    if row.get("failure"):
        f = row["failure"]
        msg += f" ({f.get('ename')}: {str(f.get('evalue'))[:160]})"
    return msg
