"""Run an environment's matrix in ONE Python process, without papermill (``--in-process``).

For hosts without the notebook stack (the offline GPU host) and for speed: every run goes
through ``workbook.investigate.run`` in this process, and runs whose engine arguments agree
share one engine (``investigate.engine_for``), so a 20-run matrix starts a handful of engines
instead of 20. The output layout is ``workbook.batch``'s (run folders with the evidence files,
``manifest.json``, ``environment.json``, ``SHA256SUMS``, the report) minus the executed
notebooks; a failing run gets ``failure.json`` and a failure row, and the batch goes on.

Not here: per-run timeouts (one process cannot kill a run and keep its engine) — use the
papermill runner where a run may hang.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from typing import Any

from workbook import batch
from workbook.config import RunConfig


def run_one(spec: batch.RunSpec, run_dir: str, *, extra_env: dict[str, str],
            kernel: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """``batch.run_one``'s contract (a manifest row), executed in this process."""
    from workbook import investigate

    for k, v in extra_env.items():
        os.environ.setdefault(k, v)
    folder = os.path.join(run_dir, spec.name)
    os.makedirs(folder)
    names = {f.name for f in dataclasses.fields(RunConfig)}
    cfg = RunConfig.from_dict({k: v for k, v in spec.params.items() if k in names})
    started = batch._now()
    t0 = time.perf_counter()
    failure = None
    try:
        investigate.run(cfg, folder, checks=tuple(spec.checks))
    except Exception as e:  # a failing run is a finding; the batch goes on
        failure = {"ename": type(e).__name__, "evalue": str(e)[:2000],
                   "traceback": traceback.format_exc()[-6000:], "cell": None}
        batch.write_json(os.path.join(folder, "failure.json"), failure)
    row = batch._row(spec, folder, 0 if failure is None else 1, False,
                     time.perf_counter() - t0, started)
    row["executed_notebook"] = None
    row["executor"] = "in-process"
    if failure is not None:
        row["failure"] = failure
    return row
