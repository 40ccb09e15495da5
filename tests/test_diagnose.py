"""Fault matrix: each injected fault is caught at the exact row and named; no false alarms.

Oracle for "the exact row": the same request on healthy vLLM emits ``</think>`` at some
(step, local_pos); a fault leaves everything before that position unchanged (greedy, same
weights), so the first violation must be exactly there. With the target ``lm_head`` zeroed,
drafts are accepted and budgets 1, 3, 6 put the boundary on the Sampler's prefill row, on a
draft row and on the bonus row of a 4-draft window. A fault that acts only on draft rows
cannot change the prefill row (``H-d-draft``: rows whose input is a draft, bonus row included)
or, for synthetic acceptance (``H-g``), the bonus row either (no draft left to accept): there
the expected verdict is ``honored`` (no false alarm), elsewhere ``violated`` with the fault's
hypothesis.
"""

from __future__ import annotations

import contextlib

import pytest

from workbook.hooks import faults
from workbook.run import diagnose, request
from workbook.core.config import RunConfig
from workbook.hooks.tracer import Tracer

METHODS = ["mtp", "eagle", "ngram"]
BUDGETS = (1, 3, 6)
# where a fault can act: (step-local position of the boundary, k) -> bool
ACTS_ON = {"H-d-draft": lambda pos, k: pos > 0, "H-g": lambda pos, k: 0 < pos < k}
IN_PROCESS_FAULTS = [f for f in faults.FAULT_NAMES if f != "H-h"]


def traced(eng, budget, fault=None, zero=True, max_tokens=12):
    handle = faults.inject(fault) if fault else None
    try:
        with request.zeroed_lm_head(eng) if zero else contextlib.nullcontext(), Tracer() as t:
            o = request.run_reported(eng, budget=budget, max_tokens=max_tokens)[0]
    finally:
        if handle is not None:
            handle.remove()
    return o, diagnose.diagnose(t.frames(), eng.effective, [o], eng.cfg)


@pytest.fixture(scope="module")
def oracle(engines):
    """(method, budget) -> (step, local_pos) where healthy vLLM emits </think>."""
    table = {}
    for m in METHODS:
        eng = engines(spec_method=m)
        for b in BUDGETS:
            with request.zeroed_lm_head(eng), Tracer() as t:
                o = request.run_reported(eng, budget=b, max_tokens=12)[0]
            assert o.honored is True, (m, b, o.token_ids)
            rows = t.frames()["rows"]
            end = eng.effective["reasoning_end_token_ids"][0]
            hit = rows[(rows["emitted_token"] == end)].sort_values(["step", "local_pos"])
            table[(m, b)] = (int(hit.iloc[0]["step"]), int(hit.iloc[0]["local_pos"]))
    return table


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fault", IN_PROCESS_FAULTS)
def test_fault_is_caught_at_the_exact_row_and_named(engines, oracle, method, fault):
    eng = engines(spec_method=method)
    for b in BUDGETS:
        o, v = traced(eng, b, fault)
        step, pos = oracle[(method, b)]
        manifests = ACTS_ON.get(fault, lambda p, k: True)(pos, eng.cfg.num_spec_tokens)
        if not manifests:
            assert v["verdict"] == "honored" and o.honored is True, (b, v["summary"])
            continue
        assert o.honored is False, (fault, b, o.token_ids)
        assert v["verdict"] == "violated", v["summary"]
        assert v["hypothesis"] == faults.hypothesis_of(fault), v["summary"]
        fv = v["first_violation"]
        assert (fv["step"], fv["local_pos"]) == (step, pos), (fault, b, fv)
        assert fv["expected_token"] == eng.effective["reasoning_end_token_ids"][0]
        assert fv["emitted_token"] != fv["expected_token"]
        assert v["client_agrees"] is True


@pytest.mark.parametrize("method", ["mtp", "eagle", "ngram", "draft_model"])
def test_healthy_runs_are_honored_no_false_alarm(engines, method):
    eng = engines(spec_method=method)
    for b in range(0, 10):
        for zero in (False, True):
            o, v = traced(eng, b, zero=zero, max_tokens=14)
            assert o.honored is True and v["verdict"] == "honored", (b, zero, v["summary"])
            assert v["hypothesis"] is None


def test_diagnosis_never_reads_the_injected_fault(engines):
    eng = engines(spec_method="mtp")
    handle = faults.inject("H-c")
    try:
        with Tracer() as t:
            o = request.run_reported(eng, budget=1, max_tokens=6)[0]
    finally:
        handle.remove()
    frames = t.frames()
    a = diagnose.diagnose(frames, eng.effective, [o], eng.cfg.replace(fault="none"))
    b = diagnose.diagnose(frames, eng.effective, [o], eng.cfg.replace(fault="H-e"))
    assert a == b and a["hypothesis"] == "H-c"


def test_v2_run_silently_served_by_v1_is_named_h_h(engines):
    eng = engines(spec_method="mtp", fault="H-h")
    assert eng.effective["runner_is_v2"] is False
    with Tracer() as t:
        o = request.run_reported(eng, budget=1, max_tokens=6)[0]
    v = diagnose.diagnose(t.frames(), eng.effective, [o], RunConfig(runner="v2"))
    assert v["hypothesis"] == "H-h"
    assert len(t.steps) == 0  # MRV2 never ran
    assert "V1" in v["summary"] or "not Model Runner V2" in v["summary"]
