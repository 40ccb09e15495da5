"""Run a validated environment's matrix into a fresh batch folder; the manifest and checksums.

``execute(env, out=..., executor="papermill")`` creates ``<out>/<hardware>/<run-id>/``
(``workbook.core.rundir.new_run_dir``: never an existing one), writes ``manifest.json`` at
once (``status: running``) and after every run, runs each selected run with the executor of
``workbook.batch.executors.EXECUTORS``, then writes ``environment.json``
(``workbook.batch.envcapture``), closes the manifest, writes ``report.html``
(``workbook.report``) and, last, ``SHA256SUMS`` over every file. Not here: loading the
environment (``environment``), running one run (``executors``), argument parsing (``cli``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from workbook.batch.environment import REPO, Environment, RunSpec, select
from workbook.batch.executors import EXECUTORS
from workbook.core.rundir import (MANIFEST, REPORT, file_sha256, new_run_dir, now, write_json,
                                  write_sums)


def execute(env: Environment, *, out: str = "outputs", only: list[str] | None = None,
            timeout: float | None = None, progress: bool = True, report: bool = True,
            on_run: Callable[[dict], None] | None = None, executor: str = "papermill") -> str:
    """Run the (selected) runs of an already validated environment; return the run folder.

    With ``report``, the folder also gets ``report.html`` (``workbook.report``) over this batch
    before ``SHA256SUMS`` is written (a failing report never costs the checksums).
    ``executor`` names the run executor (``workbook.batch.executors.EXECUTORS``).
    """
    runs = select(env, only)
    out = os.path.abspath(out)  # papermill runs with --cwd <run folder>: no relative outdir
    from workbook.batch import envcapture

    probes = envcapture.start()
    run_id, run_dir = new_run_dir(out, env.hardware)
    manifest = _manifest_head(env, run_id, runs, timeout)
    write_json(os.path.join(run_dir, MANIFEST), manifest)
    bar = _progress(len(runs), env.name, progress)
    try:
        for spec in runs:
            bar.set_postfix_str(spec.name)
            row = EXECUTORS[executor](spec, run_dir, extra_env=env.env, kernel=env.kernel,
                                      timeout=timeout)
            manifest["runs"].append(row)
            write_json(os.path.join(run_dir, MANIFEST), manifest)
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
    manifest["status"] = ("ok" if done and all(r["status"] == "ok" for r in rows)
                          else "failed" if rows else "aborted")
    manifest["counts"] = {s: sum(r["status"] == s for r in rows)
                          for s in ("ok", "failed", "timeout")}
    manifest["verdicts"] = {r["name"]: (r.get("verdict") or {}).get("verdict") for r in rows}
    write_json(os.path.join(run_dir, MANIFEST), manifest)


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
