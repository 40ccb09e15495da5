"""Every notebook, executed by papermill through ``workbook run`` on the tiny CPU model.

01_reproduce runs in tests/test_batch.py; here 02_trace, 03_diagnose (two A/B variants) and
04_fix (fault H-b, guard off / on) run as one small matrix, each its own papermill process, and
leave their evidence in the run folder. About 4–6 minutes on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_every_notebook_runs_in_a_matrix(tmp_path):
    env = {"hardware": "test-notebooks", "timeout": 900,
           "defaults": {"model": "tiny-mimo-mtp", "spec_method": "mtp"},
           "runs": [
               {"name": "trace", "notebook": "notebooks/02_trace.py",
                "thinking_token_budget": 3, "max_tokens": 8},
               {"name": "diagnose", "notebook": "notebooks/03_diagnose.py", "max_tokens": 8,
                "variants": ["MTP on (reported)", "MTP off"]},
               {"name": "fix", "notebook": "notebooks/04_fix.py", "fault": "H-b",
                "max_tokens": 8, "identity_budgets": [None, 1, 3],
                "identity_max_tokens": 6}]}
    path = tmp_path / "nb.yaml"
    path.write_text(yaml.safe_dump(env))
    out = tmp_path / "outputs"
    res = subprocess.run([sys.executable, "-m", "workbook.cli", "run", str(path), "--out",
                          str(out), "--no-progress"], cwd=REPO, capture_output=True,
                         text=True, timeout=2400)
    run_dir = Path(res.stdout.strip().splitlines()[-1])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert res.returncode == 0, [(r["name"], r.get("failure")) for r in manifest["runs"]]
    assert [r["status"] for r in manifest["runs"]] == ["ok", "ok", "ok"]

    trace = run_dir / "trace"
    assert (trace / "02_trace.ipynb").exists() and (trace / "trace" / "rows.parquet").exists()
    assert json.loads((trace / "verdict.json").read_text())["verdict"] == "honored"

    diag = run_dir / "diagnose"
    ab = (diag / "ab_checks.csv").read_text().splitlines()
    assert len(ab) == 3 and all(",honored," in line for line in ab[1:])

    fix = json.loads((run_dir / "fix" / "fix.json").read_text())["summary"]
    assert fix["violated_without_guard"] is True and fix["honored_with_guard"] is True
    assert fix["checks_exact_with_guard"] and fix["identical_on_healthy_vllm"]
    assert fix["pipeline_verdict_with_guard"] == "honored"
    assert (run_dir / "report.html").exists() and (run_dir / "SHA256SUMS").exists()
