"""The committed evidence stays lean (issue: a clone is quick, the project travels to a GPU host
in one call): what git tracks under ``outputs/`` fits ``BUDGET_MB``, no rendered page is
committed (``workbook report`` renders it again), and a compressed JSON reads and verifies as
the original (``scripts/lean_outputs.py``)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import lean_outputs  # noqa: E402

from workbook.core import rundir  # noqa: E402


def _tracked():
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    return lean_outputs.tracked(ROOT)


def test_outputs_fit_the_budget():
    size = lean_outputs.size_mb(_tracked(), ROOT)
    assert size <= lean_outputs.BUDGET_MB, (
        f"outputs/ tracks {size:.1f} MB, over the {lean_outputs.BUDGET_MB:.0f} MB budget: "
        "run `python scripts/lean_outputs.py` (or commit less)")


def test_no_rendered_page_is_committed():
    assert [p for p in _tracked() if p.endswith(".html")] == []


def test_a_compressed_json_reads_and_verifies_as_the_original(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_json(str(run / "verdict.json"), {"verdict": "honored"})
    rundir.write_json(str(run / "grid.json"), {"cells": [1, 2, 3]})
    rundir.write_sums(str(run))
    lean_outputs.gzip_file(str(run / "grid.json"))
    assert rundir.read_json(str(run / "grid.json")) == {"cells": [1, 2, 3]}
    assert rundir.verify(str(run)) == []
    with gzip.open(run / "grid.json.gz", "wt") as f:  # changed bytes are still seen
        json.dump({"cells": []}, f)
    assert rundir.verify(str(run)) == ["changed: grid.json"]


def test_the_lean_script_checks_the_budget():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "lean_outputs.py"),
                        "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "budget 25 MB" in r.stdout


def test_the_run_folder_schema_stays_plain():
    """The files the workbook finds by name (manifest, environment, each run's evidence) are never
    compressed: the lean script's list is the run-folder schema's."""
    assert lean_outputs.KEEP_PLAIN == {rundir.MANIFEST, rundir.ENVIRONMENT} | {
        f"{n}.json" for n in rundir.EVIDENCE}
    assert not [p for p in _tracked() if p.endswith(".gz")
                and os.path.basename(p[:-3]) in lean_outputs.KEEP_PLAIN]
