"""``workbook check-server --constraints`` judged without a server: the verdict of one case from
what a server returned (``serverconstraints.judge`` / ``row_breaches``), and the one-line error
for an unknown constraint name before any request. The real server's run is in
``tests/test_servercheck.py`` (the ``workbook serve`` test)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbook.core.budget import Markers
from workbook.run import serverconstraints as S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MK = Markers((10,), (11,))
PROMPT = [1, 10, 2]  # reasoning open, one reasoning token


def _sent(output, tops=None, finish="length", text=None):
    return S.Sent({}, PROMPT, list(output), finish, text, tops or [{} for _ in output], None,
                  None)


def _judge(name, kw, case, control=None, mode="processed_logprobs"):
    p = S._params(kw, [], mode)
    return S.judge(name, kw, p, case, control, MK, mode, None)


def test_stop_token_then_more_tokens_is_violated():
    v = _judge("stop", {"stop_token_ids": [7], "ignore_eos": False}, _sent([5, 7, 8, 9]))
    assert v.status == "violated" and v.first["contract"] == "stop"
    assert v.first["out_index"] == 2 and "stop token 7 at index 1" in v.first["what"]


def test_allowed_token_ids_emitted_outside_is_violated():
    v = _judge("allowed_token_ids", {"allowed_token_ids": [5, 6]}, _sent([5, 9]))
    assert v.status == "violated" and v.first["out_index"] == 1


def test_budget_end_marker_missing_is_violated_and_emitted_holds():
    # budget 1, one reasoning token in the prompt: </think> (11) due at output index 0
    assert _judge("thinking_token_budget", {"thinking_token_budget": 1},
                  _sent([11, 3])).status == "holds"
    v = _judge("thinking_token_budget", {"thinking_token_budget": 1}, _sent([3, 3]))
    assert v.status == "violated" and v.first["contract"] == "thinking_token_budget"
    assert v.first["out_index"] == 0


def test_min_tokens_rows_shift_against_the_control():
    """processed_logprobs: the min_tokens mask must hold the stop column at the clamp while
    index < min_tokens; the control (same prompt, no constraint) gives the raw row."""
    kw = {"min_tokens": 2, "stop_token_ids": [7]}
    control = _sent([5, 5], [{5: -1.0, 7: -2.0, 9: -3.0}, {5: -1.0, 7: -2.0, 9: -3.0}])
    masked = _sent([5, 5], [{5: -0.8, 7: -9999.0, 9: -2.8}, {5: -0.8, 7: -9999.0, 9: -2.8}])
    assert _judge("min_tokens", kw, masked, control).status == "holds"
    leaked = _sent([5, 5], [{5: -0.8, 7: -9999.0, 9: -2.8}, {5: -1.0, 7: -2.0, 9: -3.0}])
    v = _judge("min_tokens", kw, leaked, control)
    assert v.status == "violated" and v.first["column"] == 7 and v.first["out_index"] == 1


def test_row_contract_in_raw_mode_is_not_judged_and_says_why():
    kw = {"repetition_penalty": 1.5, "presence_penalty": -0.5}
    v = _judge("penalties", kw, _sent([5, 5]), _sent([5, 5]), mode="raw")
    assert v.status == "not judged" and "raw logprobs" in v.message


def test_unknown_constraint_is_one_line_rc2_before_any_request():
    proc = subprocess.run([sys.executable, "-m", "workbook.cli", "check-server",
                           "http://127.0.0.1:1", "--constraints", "stop,nope"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO},
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "'nope' unknown" in line and "stop_strings" in line
    with pytest.raises(S.UnknownConstraint):
        S.parse_names("stop,,nope")
    assert S.parse_names("all") == list(S.C.CONSTRAINTS)
