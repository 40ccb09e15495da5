"""The upstream patch (``upstream/``): applied to a copy of each installed vLLM, its vLLM-style
unit test run against the patched copy, and, on the default venv, an engine started from the
patched copy with vLLM's own forcing broken (``upstream/e2e_check.py``: checks A and B exact
with the built-in guard only). The venvs themselves are never modified.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("venv,version,e2e", [(".venv", "0.32.0", True),
                                              (".venv-0.29", "0.29.0", False)])
def test_upstream_patch_applies_and_passes(venv, version, e2e):
    if not (REPO / venv / "bin" / "python").exists():
        pytest.skip(f"{venv} (vLLM {version}) is not set up: bash setup.sh --tests")
    env = dict(os.environ, E2E="1" if e2e else "0", PYTHONPATH=str(REPO))
    res = subprocess.run(["bash", "upstream/apply_and_test.sh", venv, version], cwd=REPO,
                         capture_output=True, text=True, timeout=1800, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert " passed" in out and " failed" not in out, out[-2000:]
    if e2e:
        line = next(ln for ln in out.splitlines() if ln.startswith("E2E "))
        assert '"ok": true' in line, line
