"""Fault matrix: each injected fault is caught at the exact row and its cause named; no false
alarms; the host-side models the rules judge against agree with vLLM's kernels.

Oracle for "the exact row": the same batch on healthy vLLM emits ``</think>`` at some
(step, local_pos) per request; a fault leaves everything before that position unchanged
(greedy, same weights, per-request histories independent of the batch), so the first violation
of each request must be exactly there. With the target ``lm_head`` zeroed, drafts are accepted
and budgets 1, 3, 6 — one batched generate call, in that order — put the boundaries on the
Sampler's prefill row, on a draft row and on the bonus row of a 4-draft window. A fault that
cannot act at a boundary leaves that request honored (``ACTS_ON``): draft-only faults
(``H-d-draft``: rows whose input is a draft, bonus row included; ``H-g``: synthetic acceptance,
not the bonus row), faults between steps (``H-d-cache``, ``H-d-restart``: after the first
commit), and ``H-j`` (the batch's first request keeps its forcing).

When the trace cannot single out one cause, the verdict lists the candidates and the automatic
probes (``workbook.run.budget.probes``) separate them: among the catalogue faults, only ``H-f`` in a
batch needs them (a launch that never happens cannot tell "frozen" from "batch-dependent"
alone: the batch-of-1 probe does).
"""

from __future__ import annotations

import contextlib
import random

import pytest

from workbook.core import budget as rule
from workbook.core.config import RunConfig
from workbook.core.hypotheses import FAULTS, HYPOTHESES, STAGES, runtime_faults
from workbook.hooks.faults import budget as faults
from workbook.hooks.observe.tracer import Tracer
from workbook.run import request
from workbook.run.budget import diagnose
from workbook.run.budget import probes
from workbook.vllm import env as wb_env

wb_env.prepare_process(RunConfig())  # the Triton interpreter shim, before vLLM is imported

METHODS = ["mtp", "eagle", "ngram"]
BUDGETS = (1, 3, 6)
MAX_TOKENS = 12
# where a fault can act: (healthy boundary step, local position, k, batch position) -> bool
ACTS_ON = {"H-d-draft": lambda step, pos, k, bp: pos > 0,
           "H-g": lambda step, pos, k, bp: 0 < pos < k,
           "H-d-cache": lambda step, pos, k, bp: step > 0,
           "H-d-restart": lambda step, pos, k, bp: step > 0,
           "H-j": lambda step, pos, k, bp: bp > 0}
IN_PROCESS_FAULTS = [f for f in runtime_faults() if FAULTS[f].side == "missing"]  # not H-h (a
# V1 run), nor the start-up writers of issue #13 (installed before an engine starts:
# tests/test_integrity.py), nor the faults that force the end where it is not due (the other
# side of the contract: tests/test_guard.py)


def same_request(traced_id: str, outcome) -> bool:
    """The engine's request id is the client's plus a suffix (``0`` -> ``0-1a2b3c4d``)."""
    return traced_id == outcome.request_id or traced_id.startswith(f"{outcome.request_id}-")


def traced(eng, budgets, fault=None, zero=True, max_tokens=MAX_TOKENS):
    """One batched generate call (budgets in order) under ``fault``; outcomes and verdict."""
    handle = faults.inject(fault) if fault else None
    try:
        with request.zeroed_lm_head(eng) if zero else contextlib.nullcontext(), Tracer() as t:
            outs = request.run_budgets(eng, list(budgets), max_tokens)
        v = diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)
    finally:
        if handle is not None:
            handle.remove()
    return outs, v


def resolved(eng, v, violation, fault):
    """The violation's hypothesis; when ambiguous, after the probes (fault re-injected)."""
    if violation["hypothesis"] != "ambiguous":
        return violation["hypothesis"], None
    one = {**v, "first_violation": violation["first_violation"],
           "causes": violation["causes"], "hypothesis": "ambiguous"}
    with contextlib.ExitStack() as stack:
        h = faults.inject(fault)
        stack.callback(h.remove)
        res = probes.run(eng, eng.cfg, one, zero_lm_head=True, max_tokens=MAX_TOKENS)
    after = diagnose.with_probes(one, res)
    return after["hypothesis"], after


@pytest.fixture(scope="module")
def oracle(engines):
    """(method, budget) -> (step, local_pos) where healthy vLLM emits </think> in the batch."""
    table = {}
    for m in METHODS:
        eng = engines(spec_method=m)
        end = eng.effective["reasoning_end_token_ids"][0]
        with request.zeroed_lm_head(eng), Tracer() as t:
            outs = request.run_budgets(eng, list(BUDGETS), MAX_TOKENS)
        assert all(o.honored is True for o in outs), [o.token_ids for o in outs]
        rows = t.frames()["rows"]
        for o, b in zip(outs, BUDGETS):
            mine = rows["req_id"].map(lambda r: same_request(r, o))
            hit = rows[mine & (rows["emitted_token"] == end)]
            hit = hit.sort_values(["step", "local_pos"]).iloc[0]
            table[(m, b)] = (int(hit["step"]), int(hit["local_pos"]))
    return table


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fault", IN_PROCESS_FAULTS)
def test_fault_is_caught_at_the_exact_row_and_named(engines, oracle, method, fault):
    eng = engines(spec_method=method)
    want = faults.hypothesis_of(fault)
    outs, v = traced(eng, BUDGETS, fault)
    k = eng.cfg.num_spec_tokens
    assert v["verdict"] == "violated", v["summary"]
    assert v["client_agrees"] is True
    for bp, (o, b) in enumerate(zip(outs, BUDGETS)):
        step, pos = oracle[(method, b)]
        mine = [x for x in v["violations"] if same_request(x["req_id"], o)]
        if not ACTS_ON.get(fault, lambda *_: True)(step, pos, k, bp):
            # the boundary itself is untouched; a fault acting later may still force the end
            # again (H-d-restart: the count restarts after the due end): that is a violation
            # of the other side of the contract, named by the same cause
            assert o.honored is True, (b, o.token_ids)
            assert all(x["kind"] != "missing" and x["hypothesis"] == want for x in mine), \
                (b, [(x["kind"], x["causes"]) for x in mine])
            continue
        assert o.honored is False and len(mine) == 1, (fault, b, o.token_ids)
        vi = mine[0]
        fv = vi["first_violation"]
        assert (fv["step"], fv["local_pos"]) == (step, pos), (fault, b, fv)
        assert fv["expected_token"] == eng.effective["reasoning_end_token_ids"][0]
        assert fv["emitted_token"] != fv["expected_token"]
        named, after = resolved(eng, v, vi, fault)
        assert named == want, (fault, b, vi["causes"], after and after["probes"])
        cause = next(c for c in (after or vi)["causes"] if c["hypothesis"] == want)
        assert cause["saw"] and cause["confirm"] and cause["stage"] in STAGES
    # the verdict's chain: stage -> anomaly -> cause -> confirm -> result, for every cause
    assert v["chain"] and all(r["stage"] and r["anomaly"] and r["cause"] for r in v["chain"])


@pytest.mark.parametrize("method", ["mtp", "eagle", "ngram", "draft_model"])
def test_healthy_runs_no_false_alarm_and_tracing_changes_nothing(engines, method):
    """Single requests at budgets 0, 1, 2, 5, 9 (drafts accepted), and one batched generate call with
    mixed budgets (0-9 and none), drafts accepted and rejected: every verdict honored, no
    contract break anywhere in the trace, traced and untraced batches token-identical."""
    eng = engines(spec_method=method)
    for b in (0, 1, 2, 5, 9):  # singles at the edges; the mixed batch below holds 0-9
        (o,), v = traced(eng, [b], max_tokens=14)
        assert o.honored is True and v["verdict"] == "honored", (b, v["summary"])
        assert v["hypothesis"] is None and v["causes"] == [] and v["anomalies"] == [], \
            (b, v["anomalies"])
    mixed = [7, None, 0, 3, 9, 1, 5, 2, 8, 4, 6]
    for zero in (True, False):
        with request.zeroed_lm_head(eng) if zero else contextlib.nullcontext():
            plain = request.run_budgets(eng, mixed, 14)
        outs, v = traced(eng, mixed, zero=zero, max_tokens=14)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], zero
        assert all(o.honored in (True, None) for o in outs) and v["verdict"] == "honored"
        assert v["anomalies"] == [], (zero, v["anomalies"])


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


def test_reporter_state_h_i_leaves_version_and_storage_and_probes_confirm(engines):
    """The reporter's measured state: the marker tensors read 0 with storage and ``_version``
    unchanged; the verdict names H-i from the device values, and the markers-re-uploaded probe
    (and the guard) turn it into honored; the engine is healthy again after removal."""
    eng = engines(spec_method="mtp")
    st = eng.runner.sampler.thinking_budget_state
    names = ("reasoning_start_token_ids", "reasoning_end_token_ids",
             "natural_reasoning_end_token_ids")
    before = {n: (getattr(st, n).data_ptr(), getattr(st, n)._version) for n in names}
    handle = faults.inject("H-i")
    try:
        with Tracer() as t:
            outs = request.run_reported(eng, budget=1, max_tokens=6)
        assert [int(getattr(st, n)[0]) for n in names] == [0, 0, 0]
        assert {n: (getattr(st, n).data_ptr(), getattr(st, n)._version) for n in names} \
            == before
        v = diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)
        assert v["hypothesis"] == "H-i", v["summary"]
        saw = v["causes"][0]["saw"]
        assert "storage unchanged and _version" in saw and "no tracked PyTorch write" in saw
        res = probes.run(eng, eng.cfg, v, max_tokens=6, zero_lm_head=False)
        assert set(res) == {"markers", "guard"}, res
        assert res["markers"]["verdict"] == "honored" and res["guard"]["verdict"] == "honored"
        after = diagnose.with_probes(v, res)
        assert after["hypothesis"] == "H-i" and after["causes"][0]["confirmed_by"] == [
            "markers", "guard"]
        assert [r["result"] for r in after["chain"]] == ["markers: honored ✓, guard: honored ✓"]
        assert [int(getattr(st, n)[0]) for n in names] == [0, 0, 0]  # the probe restored them
    finally:
        handle.remove()
    assert [int(getattr(st, n)[0]) for n in names] == [
        eng.effective["reasoning_start_token_ids"][0],
        eng.effective["reasoning_end_token_ids"][0],
        eng.effective["reasoning_end_token_ids"][0]]


def test_pipeline_runs_the_probes_and_feeds_them_back(engines, tmp_path):
    """``RunConfig(probes=True)``: after the violated verdict, ``probes.json`` holds the probes
    the cause calls for, and ``verdict.json`` is re-saved with their results in its chain."""
    from workbook.core import rundir
    from workbook.run import pipeline
    from workbook.run.backends import InProcess

    eng = engines(spec_method="mtp")
    cfg = eng.cfg.replace(fault="H-d", probes=True, thinking_token_budget=1, max_tokens=6)
    res = pipeline.run(cfg, str(tmp_path), backend=InProcess(cfg, engine=eng))
    v = rundir.read_json(str(tmp_path / "verdict.json"))
    p = rundir.read_json(str(tmp_path / "probes.json"))
    assert v == json_roundtrip(res.verdict) and v["hypothesis"] == "H-d", v["summary"]
    assert set(p) == {"budget", "guard"} and v["probes"] == p
    assert p["budget"]["verdict"] == "honored" and p["guard"]["verdict"] == "honored"
    assert v["chain"][0]["result"] == "budget: honored ✓, guard: honored ✓"
    assert "probes_s" in res.timings


def json_roundtrip(obj):
    import json

    return json.loads(json.dumps(obj))


def test_v2_run_silently_served_by_v1_is_named_h_h(engines):
    eng = engines(spec_method="mtp", fault="H-h")
    assert eng.effective["runner_is_v2"] is False
    with Tracer() as t:
        o = request.run_reported(eng, budget=1, max_tokens=6)[0]
    v = diagnose.diagnose(t.frames(), eng.effective, [o], RunConfig(runner="v2"))
    assert v["hypothesis"] == "H-h"
    assert len(t.steps) == 0  # MRV2 never ran
    assert "V1" in v["summary"] or "not Model Runner V2" in v["summary"]


# ---- the host-side models the rules judge against, vs vLLM's own kernels ----------------------

def _vllm_scan(hist, cache, start, nat):
    import torch

    from vllm.v1.worker.gpu.sample import thinking_budget as tb

    i32 = (lambda x: torch.tensor(x, dtype=torch.int32))
    ls, le, sp = (i32([c]) for c in cache)
    tb._update_committed_marker_cache_kernel[(1,)](
        i32([0]), i32([5]), i32([hist + [0] * 4]), len(hist) + 4, i32([len(hist)]), ls, le, sp,
        i32(start), i32(nat), START_LEN=len(start), NATURAL_END_LEN=len(nat),
        MAX_LEN=max(len(start), len(nat)), BLOCK=8)
    return int(ls[0]), int(le[0]), int(sp[0])


@pytest.mark.parametrize("seed", range(4))
def test_marker_cache_model_matches_vllms_scan_kernel(seed):
    """``budget.scan_marker_cache`` (what a right cache must become) against vLLM's
    ``_update_committed_marker_cache_kernel``, cold and incremental, single- and multi-token
    markers, histories longer than one cold-scan block."""
    rnd = random.Random(seed)
    for start, nat in (([1], [3]), ([1, 2], [4, 3])):
        m = rule.Markers(start=start, end=nat, natural_end=nat)
        for _ in range(6):
            hist = [rnd.choice([0, 1, 2, 3, 4, 5, 5]) for _ in range(rnd.randint(1, 30))]
            cold = rule.scan_marker_cache(hist, 0, -1, -1, m, block=8)
            assert cold == _vllm_scan(hist, (-1, -1, 0), start, nat), hist
            cut = rnd.randint(0, len(hist))  # a cache left by an apply at an earlier length
            prev = rule.scan_marker_cache(hist[:cut], 0, -1, -1, m, block=8)
            got = rule.scan_marker_cache(hist, prev[2], prev[0], prev[1], m, block=8)
            assert got == _vllm_scan(hist, (prev[0], prev[1], prev[2]), start, nat), hist
            assert rule.cache_start(got[0], got[1]) == rule.last_start(hist, m), hist


def test_probes_feed_back_into_the_verdict():
    """``with_probes``: a probe whose result contradicts a candidate's prediction refutes it;
    a probe that is positive evidence on its own adds its cause; the chain carries results."""
    v = {"verdict": "violated", "hypothesis": "ambiguous",
         "first_violation": {"budget": 3, "step": 1, "local_pos": 1, "path": "x",
                             "batch_size": 3},
         "causes": [{"hypothesis": h, "title": HYPOTHESES[h].title, "stage": HYPOTHESES[h].stage,
                     "saw": "seen", "confirm": HYPOTHESES[h].confirm}
                    for h in ("H-d-kernel", "H-j")],
         "violations": [], "anomalies": [], "requests": []}
    assert probes.plan(v, RunConfig()) == ["alone", "guard"]
    after = diagnose.with_probes(v, {"alone": {"verdict": "honored", "switch": "alone"},
                                     "guard": {"verdict": "honored", "switch": "guard"}})
    assert after["hypothesis"] == "H-j" and after["refuted"][0]["hypothesis"] == "H-d-kernel"
    assert [r["status"] for r in after["chain"]] == ["named", "refuted by alone"]
    one = {**v, "hypothesis": "unclassified", "causes": []}
    assert set(probes.plan(one, RunConfig())) == {"alone", "markers", "budget", "caches",
                                                  "guard"}
    after = diagnose.with_probes(one, {"markers": {"verdict": "honored", "switch": "m"},
                                       "alone": {"verdict": "violated", "switch": "a"}})
    # the markers probe cannot tell who wrote them (in band or not): both, from the probe
    assert after["hypothesis"] == "ambiguous" and {c["hypothesis"] for c in after["causes"]} \
        == {"H-i", "H-i-inband"} and all(c["from_probe"] == "markers" for c in after["causes"])
    assert diagnose.chain_rows(after)[0]["cause"].startswith("H-i")


# ---- issue #18: faults written outside the catalogue (benchmarks/attribution.py) ------------

def _held_out(eng, name, budgets, **params):
    """One batched generate call (drafts accepted) under a held-out raw-patch fault."""
    from benchmarks.attribution import injected

    with injected(name), request.zeroed_lm_head(eng), Tracer() as t:
        outs = request.run_budgets(eng, budgets, MAX_TOKENS, **params)
    return outs, diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)


def _probed(eng, v, vi, name, **params):
    from benchmarks.attribution import injected

    one = {**v, "first_violation": vi["first_violation"], "causes": vi["causes"],
           "hypothesis": vi["hypothesis"]}
    with injected(name):
        res = probes.run(eng, eng.cfg, one, zero_lm_head=True, max_tokens=MAX_TOKENS,
                         params=params or None)
    return res, diagnose.with_probes(one, res)


def test_mixed_batch_budgets_stay_ints_and_probes_run(engines):
    """A batch mixing budgeted and unbudgeted requests: every budget in the verdict is an int
    (the summary never says "budget 1.0"), and the probes re-send it without vLLM rejecting
    the budget."""
    eng = engines(spec_method="mtp")
    outs, v = traced(eng, [1, None, 23], fault="H-d")
    assert v["verdict"] == "violated"
    assert [r["budget"] for r in v["requests"]] == [1, None, 23]
    assert all(type(r["budget"]) is int for r in v["requests"] if r["budget"] is not None)
    assert "budget 1 violated" in v["summary"] and ".0" not in v["summary"].split(":")[0]
    assert [b["budget"] for b in v["first_violation"]["batch"]] == [1, None, 23]
    with contextlib.ExitStack() as stack:
        h = faults.inject("H-d")
        stack.callback(h.remove)
        res = probes.run(eng, eng.cfg, v, zero_lm_head=True, max_tokens=MAX_TOKENS)
    assert res and all(p["ran"] for p in res.values()), res
    assert res["budget"]["budgets"] == [1, None, 23] and res["budget"]["verdict"] == "honored"
    after = diagnose.with_probes(v, res)
    assert after["hypothesis"] == "H-d" and "budget 1 violated" in after["summary"]


def test_reversed_mapping_is_named_at_the_mapping_not_the_budget_it_misread(engines):
    """The row->slot mapping reversed in place: the evidence reads every per-slot value at the
    slot the host registered (req_id_to_index), so the wrong budget the kernel read is not
    taken for a stale device budget (H-d): the mapping stage is named (H-j), the batch-of-1
    probe confirms it. Requests 0 and 2 swap slots: budget 1 reads "no budget" (never forced),
    the request without a budget reads budget 1 (forced); the middle one keeps its own."""
    eng = engines(spec_method="mtp")
    outs, v = _held_out(eng, "mapping_reversed_in_place", [1, 6, None])
    assert v["verdict"] == "violated", v["summary"]
    named = {vi["req_id"]: vi for vi in v["violations"]}
    assert all(vi["hypothesis"] == "H-j" for vi in named.values()), \
        [(vi["budget"], vi["causes"]) for vi in named.values()]
    kinds = {vi["budget"]: vi["kind"] for vi in named.values()}
    assert kinds == {1: "missing", None: "unbudgeted"}, kinds
    assert outs[1].honored is True
    assert "req_id_to_index" in v["causes"][0]["saw"]
    vi = next(x for x in v["violations"] if x["budget"] == 1)
    res, after = _probed(eng, v, vi, "mapping_reversed_in_place")
    assert res["alone"]["verdict"] == "honored" and after["hypothesis"] == "H-j"
    assert "alone" in after["causes"][0]["confirmed_by"]


@pytest.mark.parametrize("name,budgets,kind,hyp", [
    ("draft_rows_forced_early", [1, 3, 6], "early", "H-d-kernel"),
    ("forced_again_after_end", [1, 3, 6], "twice", "H-d-kernel"),
    ("unbudgeted_registered_zero", [1, None, 6], "unbudgeted", "H-c"),
    ("unbudgeted_device_budget_zero", [1, None, 6], "unbudgeted", "H-d"),
])
def test_forcing_where_not_due_is_a_violation_with_its_row_and_cause(engines, name, budgets,
                                                                     kind, hyp):
    """The other side of the contract: </think> forced before the budget binds, after
    reasoning ended, or into a request without a budget — each a violation at the first
    forced row, with the stage that forced it (the healthy batch is honored: test above)."""
    eng = engines(spec_method="mtp")
    outs, v = _held_out(eng, name, budgets)
    assert v["verdict"] == "violated", v["summary"]
    mine = [vi for vi in v["violations"] if vi["kind"] == kind]
    assert mine, [(vi["budget"], vi["kind"]) for vi in v["violations"]]
    vi = mine[0]
    fv = vi["first_violation"]
    assert fv["emitted_token"] == eng.effective["reasoning_end_token_ids"][0]
    assert fv["step"] is not None and fv["local_pos"] is not None
    assert vi["hypothesis"] == hyp, vi["causes"]
    # never "no budget violated" (which reads as "nothing violated")
    assert v["summary"].startswith(("budget", "the budget's contract, in a request without "
                                              "a budget, violated")), v["summary"]


def test_weak_bias_is_described_by_the_bias_found(engines):
    """A due row biased +5 (not +1e9) where token 0's logit is 98.5: the cause says the bias
    found at the due column and the logit that won."""
    eng = engines(spec_method="mtp")
    outs, v = _held_out(eng, "weak_bias", [1, 3, 6])
    assert v["verdict"] == "violated", v["summary"]
    vi = v["violations"][0]
    assert vi["hypothesis"] == "H-d-kernel", vi["causes"]
    saw = vi["causes"][0]["saw"]
    assert "+5 at the due column" in saw and "98.5" in saw and "no +1e9" not in saw, saw


def test_inband_marker_write_is_not_named_out_of_band(engines):
    """A PyTorch write to the markers (_version moves) is H-i-inband, whose text says so;
    never H-i, whose text says no tracked PyTorch write put the values there."""
    eng = engines(spec_method="mtp")
    outs, v = _held_out(eng, "inband_end_marker_write", [1, 3, 6])
    assert v["verdict"] == "violated", v["summary"]
    assert {vi["hypothesis"] for vi in v["violations"]} == {"H-i-inband"}, v["summary"]
    assert "PyTorch write" in v["causes"][0]["saw"] and "_version" in v["causes"][0]["saw"]
