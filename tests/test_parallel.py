"""Tensor / pipeline parallel without an engine: the layout's validation, the CPU binding,
the rank columns of a merged trace and the agreement of the sampling ranks (docs/parallel.md)."""

import json
import os

import pandas as pd
import pytest

from workbook.core import ranks, tracefiles
from workbook.core.config import ConfigError, RunConfig, validate
from workbook.vllm import env, engine


@pytest.mark.parametrize("kw, words", [
    (dict(tensor_parallel_size=0), "tensor_parallel_size=0 must be"),
    (dict(pipeline_parallel_size=-1), "pipeline_parallel_size=-1 must be"),
    (dict(tensor_parallel_size=64), "= 64 ranks"),
    (dict(tensor_parallel_size=2, zero_lm_head=True), "zero_lm_head=True"),
    (dict(tensor_parallel_size=2, probes=True), "probes=True"),
    (dict(pipeline_parallel_size=2, constraint_fault="bias-target-row-only"), None),
    (dict(pipeline_parallel_size=2, spec_method="mtp"), "vLLM #52071"),
])
def test_a_parallel_layout_vllm_cannot_run_is_one_line_before_any_engine(kw, words):
    with pytest.raises(ConfigError) as e:
        validate(RunConfig(**kw), on_cpu=True)
    assert "\n" not in str(e.value)
    if words:
        assert words in str(e.value)


def test_tp2_maps_to_vllm_arguments_and_one_core_per_rank_on_cpu():
    cfg = RunConfig(tensor_parallel_size=2)
    assert engine.engine_kwargs(cfg)["tensor_parallel_size"] == 2
    assert "pipeline_parallel_size" not in engine.engine_kwargs(RunConfig())
    cores = sorted(os.sched_getaffinity(0))
    bind = env.vllm_env(cfg, cpu=True).get(env.CPU_BIND)
    if len(cores) >= 2:
        assert bind == f"{cores[0]}|{cores[1]}"
    assert env.CPU_BIND not in env.vllm_env(RunConfig(), cpu=True)
    assert env.CPU_BIND not in env.vllm_env(cfg, cpu=False)
    target = {env.CPU_BIND: "nobind"}
    env.apply({env.CPU_BIND: "0|1"}, target)
    assert target[env.CPU_BIND] == "nobind"  # the user's own binding wins


def _rank_trace(root, pid, tp, rows):
    d = root / str(pid)
    d.mkdir()
    (d / "rank.json").write_text(json.dumps({"pid": pid, "tp_rank": tp, "tp_size": 2,
                                             "pp_rank": 0, "pp_size": 1, "samples": True}))
    df = pd.DataFrame(rows, columns=tracefiles.REQUEST_COLUMNS[:len(rows[0])])
    tracefiles.save({"requests": df}, str(d))


def test_rank_columns_and_a_rank_whose_budget_state_differs_is_reported(tmp_path):
    cols = tracefiles.REQUEST_COLUMNS
    base = dict(step=1, req_id="r0", slot=0, phase="decode", path="rejection", enabled=True,
                use_thinking_budget=True, budget_host=1, budget_device=1, gate=True,
                fast_path=False, last_start=10, last_end=-1, emitted=[369])

    def row(**over):
        d = {**base, **over}
        return [d.get(c) for c in cols]

    _rank_trace(tmp_path, 101, 0, [row(), row(step=2, emitted=[5])])
    _rank_trace(tmp_path, 102, 1, [row(), row(step=2, emitted=[5])])
    frames = tracefiles.load(str(tmp_path))
    assert set(frames["requests"]["tp_rank"]) == {0, 1}
    agree = ranks.agreement(frames)
    assert agree["agree"] and agree["compared_rows"] == 2 and agree["ranks"] == ["pp0/tp0", "pp0/tp1"]
    assert len(ranks.of_rank(frames, 0, 1)["requests"]) == 2

    other = tmp_path / "b"
    other.mkdir()
    _rank_trace(other, 201, 0, [row(), row(step=2)])
    _rank_trace(other, 202, 1, [row(), row(step=2, budget_device=0)])
    agree = ranks.agreement(tracefiles.load(str(other)))
    assert not agree["agree"]
    assert agree["differences"] == [{"rank": "pp0/tp1", "step": 2, "req_id": "r0",
                                     "field": "budget_device", "reference": 1, "value": 0}]


# ---- the guard's report and the start-up watch per rank (no engine) ---------------------------

def _rank_file(root, pid, tp, name, data, pp=0):
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "rank.json").write_text(json.dumps({"pid": pid, "tp_rank": tp, "tp_size": 2,
                                             "pp_rank": pp, "pp_size": 1, "samples": True}))
    (d / name).write_text(json.dumps(data))


def _guard(fixed=0, repaired=0, steps=4, repairs=()):
    return {"installed": True, "enabled": True, "guarded_steps": steps, "fixed_tokens": fixed,
            "taken_back_tokens": 0, "untaken_steps": 0, "untaken_rows": 0, "untaken": [],
            "repaired_fields": repaired, "repaired_requests": sorted({r["req_id"] for r in repairs}),
            "repairs": list(repairs), "repairs_dropped": 0, "truth_lagged_rows": 0}


REPAIR = {"guard_step": 3, "req_id": "r2", "slot": 0, "row": 0, "total_len_before": 20,
          "field": "count", "found": [0, 5, 5], "truth": 5, "truth_from": "host"}


@pytest.mark.parametrize("rank1, agree, fields", [
    (_guard(), True, []),  # the same report: no finding
    (_guard(repaired=1, repairs=[REPAIR]), False, ["repaired_fields", "repaired_requests"]),
    (_guard(fixed=2), False, ["fixed_tokens"]),
])
def test_each_ranks_guard_report_is_kept_and_a_rank_that_differs_is_a_finding(
        tmp_path, rank1, agree, fields):
    # pids in the reverse order of the ranks: the reference (tp0) still leads
    _rank_file(tmp_path, 200, 0, "guard.json", _guard())
    _rank_file(tmp_path, 100, 1, "guard.json", rank1)
    per = ranks.read_per_rank(str(tmp_path), "guard.json")
    assert list(per) == ["pp0/tp0", "pp0/tp1"]
    assert per["pp0/tp1"]["tp_rank"] == 1 and per["pp0/tp1"]["pid"] == "100"
    sec = ranks.guard_section(per)
    assert sec["available"] and sec["rank"] == "pp0/tp0"
    assert set(sec["ranks"]) == {"pp0/tp0", "pp0/tp1"}
    assert sec["agreement"]["agree"] is agree
    assert sorted(d["field"] for d in sec["agreement"]["differences"]) == fields
    assert all(d["rank"] == "pp0/tp1" for d in sec["agreement"]["differences"])
    table = ranks.guard_table(per)
    assert list(table["tp_rank"]) == [1] * len(rank1["repairs"])
    assert {"tp_rank", "pp_rank"} <= set(table.columns)


def test_a_ranks_guard_report_of_one_run_on_a_shared_engine():
    old = dict(REPAIR, req_id="r0", guard_step=1)
    before = _guard(fixed=1, repaired=1, steps=4, repairs=[old])
    now = _guard(fixed=3, repaired=2, steps=10, repairs=[old, REPAIR])
    run = ranks.guard_of_run(now, before, old_reqs={"r0"})
    assert (run["guarded_steps"], run["fixed_tokens"], run["repaired_fields"]) == (6, 2, 1)
    assert run["repairs"] == [REPAIR] and run["repaired_requests"] == ["r2"]
    assert ranks.guard_of_run(now, None, ())["fixed_tokens"] == 3  # the engine's first run


def test_no_rank_wrote_a_guard_report_says_so(tmp_path):
    sec = ranks.guard_section(ranks.read_per_rank(str(tmp_path / "absent"), "guard.json"))
    assert sec["available"] is False and "guard.json" in sec["why"]


def _watch(changed=False):
    w = {"state_found": True, "phase_order": ["load", "step 1"], "steps": {"real_steps": 3},
         "changes": [], "localization": {}}
    if changed:
        ch = {"tensor": "end_ids", "role": "marker", "phase": "profiling run › drafter",
              "top_phase": "profiling run", "before": [369], "after": [0],
              "last_clean": "a", "first_dirty": "b", "ptr_moved": False, "version": [1, 1]}
        w["first_change"], w["changes"] = ch, [ch]
    return w


@pytest.mark.parametrize("tp0, tp1, verdict, lead, agree", [
    (False, False, "intact", "pp0/tp0", True),
    (False, True, "corrupted", "pp0/tp1", False),  # only rank 1's copy changed: still found
    (True, True, "corrupted", "pp0/tp0", True),
])
def test_the_watch_reading_covers_every_ranks_copy_of_the_state(tmp_path, tp0, tp1, verdict,
                                                                  lead, agree):
    from workbook.run import integrity

    _rank_file(tmp_path, 7, 1, "watch.json", _watch(tp1))
    _rank_file(tmp_path, 8, 0, "watch.json", _watch(tp0))
    per = ranks.read_per_rank(str(tmp_path), "watch.json")
    watch = {**next(iter(per.values())), "ranks": per}
    out = integrity.verdict_from_watches(watch)
    assert (out["verdict"], out["rank"]) == (verdict, lead)
    assert {k: v["verdict"] for k, v in out["ranks"].items()} == {
        "pp0/tp0": "corrupted" if tp0 else "intact", "pp0/tp1": "corrupted" if tp1 else "intact"}
    assert out["rank_agreement"]["agree"] is agree
    assert ("a finding of its own" in out["saw"]) is (not agree)
    assert out["ranks"]["pp0/tp1"]["tp_rank"] == 1
    # one rank: the plain reading
    assert "ranks" not in integrity.verdict_from_watches(_watch(False))


def test_the_plugin_writes_its_ranks_guard_report_with_every_trace_flush(tmp_path):
    from workbook.hooks import plugin

    class Runner:  # no guard state on it: the report says the guard never ran there
        pass

    class Trace:
        flush_dir = str(tmp_path / "123")
        flushed = 0

        def flush(self):
            Trace.flushed += 1

    t = Trace()
    plugin._RUNNERS[:] = [Runner()]
    try:
        plugin._guard_report_on_flush(t)
        t.flush()
    finally:
        plugin._RUNNERS[:] = []
    rep = json.loads((tmp_path / "123" / plugin.GUARD_FILE).read_text())
    assert Trace.flushed == 1 and rep["guarded_steps"] == 0 and rep["repairs"] == []


@pytest.mark.parametrize("found, lead, several", [
    ({8: True}, "pp0/tp0", False),                  # one process: its reading, plain
    ({7: True, 8: True}, "pp0/tp0", True),          # two ranks: the reference rank leads
    ({7: True, 8: False}, "pp0/tp1", True),         # the rank whose watch found the state leads
])
def test_the_served_watch_reading_goes_through_the_per_rank_reader(tmp_path, found, lead,
                                                                     several):
    from workbook.hooks import watch as wmod

    for pid, ok in found.items():
        _rank_file(tmp_path, pid, {7: 1, 8: 0}[pid], "watch.json", {"state_found": ok})
    got = wmod.read_dir(str(tmp_path))
    assert got["state_found"] is True
    assert ("ranks" in got) is several
    assert got.get("rank", lead) == lead and got["tp_rank"] == int(lead[-1])
    assert wmod.read_dir(str(tmp_path / "absent")) is None


def test_ranks_that_disagree_are_said_in_one_sentence():
    ag = {"ranks": ["pp0/tp0", "pp0/tp1"], "reference": "pp0/tp0", "agree": False,
          "differences": [{"rank": "pp0/tp1", "step": 0, "req_id": "r", "field": f,
                           "reference": a, "value": b}
                          for f, a, b in (("gate", True, False), ("emitted", [369], [1417]))]
          + [{"rank": "pp0/tp1", "step": 1, "req_id": "r", "field": "budget_host",
              "reference": 1, "value": None}]}
    s = ranks.disagreement(ag)
    assert s.startswith("rank pp0/tp1 disagrees with the reference rank pp0/tp0: from step 0 "
                        "(request r: emitted, gate differ)") and "finding of its own" in s
    assert ranks.disagreement({**ag, "agree": True}) is None
    assert ranks.disagreement({"ranks": ["pp0/tp0"], "agree": True, "differences": []}) is None


@pytest.mark.parametrize("raw, want", [(None, None), ("", None), ("1", {1}), ("0, 1", {0, 1}),
                                       ("x", "tensor-parallel ranks"), ("-1", ">= 0")])
def test_fault_ranks_are_read_or_refused_naming_the_value(raw, want):
    from workbook.vllm import env as wenv

    if isinstance(want, str):
        with pytest.raises(ValueError, match=want):
            wenv.fault_ranks(raw)
    else:
        assert wenv.fault_ranks(raw if raw is not None else "") == want
