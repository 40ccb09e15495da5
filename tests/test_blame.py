"""Blame only on evidence (issue 39), on defects written inside vLLM's own modules and kept out
of the workbook's catalogue (tests/_defects.py), through the real engine (tiny MTP model, one
engine for the module). Each case sends the same sequence of batches healthy and with the
defect; ground truth is the healthy run's row evidence: every request whose rows or tokens
changed must be reported at the exact first changed (step, row), with the contract, stage and
source the evidence shows; a request whose rows and output equal healthy vLLM's is never
reported violated."""

import pytest

from tests import _defects
from workbook.run.constraints import cases as C
from workbook.run.constraints import grid as G
from workbook.run.constraints import rowjudge

# defect -> (batches sent in order: case names; the last batch is judged),
#           {case: (contract, stage, source)} for the requests whose rows change
CASES = {
    "stale_allowed_mask": ([["allowed_token_ids"], ["max_tokens", "allowed_token_ids"]],
                           {"max_tokens": ("allowed_token_ids", "registration",
                                           "previous occupant")}),
    "raised_column": ([["allowed_token_ids", "bad_words", "max_tokens"]],
                      {"bad_words": (rowjudge.UNEXPLAINED, "apply", "neighbour presence"),
                       "max_tokens": (rowjudge.UNEXPLAINED, "apply", "neighbour presence")}),
    # the row judge's first reading (the live neighbour's contract gives the values) refuted by
    # the request beside that neighbour alone on fresh slots: the slot's previous occupant
    "stale_allowed_ids": ([["allowed_token_ids"], ["allowed_other", "allowed_token_ids"]],
                          {"allowed_other": ("allowed_token_ids", "registration",
                                             "previous occupant")}),
    "stale_penalty_counts": ([["penalties"], ["penalties"]],
                             {"penalties": ("penalties", "device state", "own")}),
}


@pytest.fixture(scope="module")
def engine():
    from workbook.vllm import engine as vengine

    eng = vengine.start(G.config_for("mtp"))
    yield eng
    eng.shutdown()


# cases outside the grid's own: a request asking for as many allowed ids as the grid's case
EXTRA = {"allowed_other": {"allowed_token_ids": [8, 9, 10]}}
# defects whose sequence pins slots: the first batch on a never-used slot, the next batch's
# first request on that same slot, its others on never-used slots (the slot history the
# defect needs, the same in the healthy and the faulty run)
PINNED = ("stale_allowed_ids",)


def _send(engine, batches, max_tokens=8, pin=False):
    """The batches in order (8 tokens each: the test stays cheap); the last one's cells."""
    from workbook.run.constraints import invariance

    kw = {c: EXTRA.get(c) or C.case_kwargs(c, [0] * 16, engine.tokenizer.decode)
          for b in batches for c in b}
    cfg = C.RunConfig(trace=False, thinking_token_budget=-1, max_tokens=max_tokens)
    first = None
    for b in batches:
        slots = []
        if pin:  # the others: slots whose last occupant asked for no allowed ids
            from workbook.hooks.observe import rowcheck

            led = rowcheck.slot_ledger(engine.runner)
            free = engine.runner.req_states.free_indices
            clean = invariance.fresh_slots(engine) + [
                x for x in free if x in led and led[x][-1]["params"]["allowed_token_ids"] is None]
            first = first if first is not None else clean[0]
            slots = [first] + [x for x in clean if x != first][:len(b) - 1]
        with invariance.slots_next(engine, slots):
            cells, ev = C.run_batch(engine, {c: kw[c] for c in b}, zero_head=True, cfg=cfg,
                                    batch="mixed" if len(b) > 1 else "single")
        if pin:
            assert [ev[c]["registration"]["slot"] for c in b] == slots, "slots not pinned"
    return cells, ev


def _first_change(healthy: dict, faulty: dict) -> tuple | None:
    """The first (step, row) where a request's recorded rows (raw and processed values at the
    kept columns, the emitted token) differ between the two runs (the independent truth)."""
    def same(a, b):
        if a["local_pos"] != b["local_pos"] or a.get("emitted_token") != b.get("emitted_token"):
            return False
        return all(abs(a[k][c] - b[k][c]) <= 1e-4 or a[k][c] == b[k][c]
                   for k in ("raw", "proc") for c in set(a[k]) & set(b[k]))
    for sh, sf in zip(healthy["steps"], faulty["steps"]):
        if len(sh["rows"]) != len(sf["rows"]):
            return sf["step"], sf["rows"][0]["row"]
        for rh, rf in zip(sh["rows"], sf["rows"]):
            if not same(rh, rf):
                return sf["step"], rf["row"]
    return None


@pytest.mark.parametrize("defect", sorted(CASES))
def test_blame_on_defects_written_outside(engine, defect):
    batches, want = CASES[defect]
    pin = defect in PINNED
    healthy, hev = _send(engine, batches, pin=pin)
    with _defects.DEFECTS[defect]():
        cells, ev = _send(engine, batches, pin=pin)
    for name, cell in cells.items():
        changed = _first_change(hev[name], ev[name]) is not None or \
            cell.output != healthy[name].output
        assert healthy[name].status == "holds", (name, healthy[name].first)
        if not changed:  # rows and output equal healthy vLLM's: never violated
            assert cell.status == "holds", (defect, name, cell.first)
            continue
        assert name in want, (defect, name, "changed but not expected", cell.first)
        contract, stage, source = want[name]
        f = cell.first
        assert cell.status == "violated", (defect, name, cell.status)
        assert (f["step"], f["row"]) == _first_change(hev[name], ev[name]), (defect, name, f)
        assert (f["contract"], f["stage"], f["source"]) == (contract, stage, source), f
        assert "None" not in f["what"] and "nan" not in f["what"], f["what"]
        if cell.alone is not None:  # the reference really ran on a slot nobody held
            assert cell.alone["fresh"], cell.alone
        if source == "neighbour presence":  # the batch-invariance reference named the trigger
            assert f["by_request"] == ["allowed_token_ids"], f
            assert cell.alone and not cell.alone["equal"], cell.alone
            assert f"its output holds {_defects.COLUMN} at" in f["what"], f["what"]
        print(f"{defect}: {name}: {f['contract']} / {f['stage']} / {f['source']}: {f['what']}")
    for name in want:  # every expected victim really changed
        assert cells[name].status == "violated", (defect, name, cells[name].status)


# budget defect -> (budgets of the batch, the violation kind, the cause, words of its sentence)
BUDGET_CASES = {
    "budget_small_push": ([3, 6, None], "early", "H-d-kernel",
                          ("the budget's apply raised its end column by +5", "not the +1e9")),
    "end_raised_by_bias_stage": ([None, 3, 6], "unbudgeted", "H-p",
                                 ("before the budget's apply (another logits processor",)),
    "end_forced_by_bias_stage": ([3, 6, None], "early", "H-p",
                                 ("-> 1e+09 before the budget's apply",)),
}


@pytest.mark.parametrize("defect", sorted(BUDGET_CASES))
def test_an_end_pushed_where_none_was_due_is_a_violation_whatever_pushed_it(engine, defect):
    """The budget by the same rule: an end of reasoning emitted where none was due is a
    violation whatever put it there — any stage, any size of push (the trace's end column after
    each stage) —, named from that evidence, the guard's not taking it back said; a summary
    never reads as "nothing violated"."""
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose

    budgets, kind, hyp, words = BUDGET_CASES[defect]
    end = engine.effective["reasoning_end_token_ids"][0]
    with _defects.BUDGET_DEFECTS[defect](end), request.zeroed_lm_head(engine), Tracer() as t:
        outs = request.run_budgets(engine, budgets, 8)
    v = diagnose.diagnose(t.frames(), engine.effective, outs, engine.cfg)
    assert v["verdict"] == "violated", v["summary"]
    vi = v["violations"][0]
    assert vi["kind"] == kind and vi["hypothesis"] == hyp, (vi["kind"], vi["causes"])
    fv = vi["first_violation"]
    assert fv["emitted_token"] == end and (fv["step"], fv["local_pos"]) == (0, 0), fv
    saw = vi["causes"][0]["saw"]
    assert all(w in saw for w in words) and "the guard does not take it back" in saw, saw
    assert "none" not in saw.split("column(s)")[-1][:6], saw
    assert not v["summary"].startswith("no budget"), v["summary"]
    # every request whose tokens changed is violated (the healthy batch: tests/test_diagnose.py)
    changed = [o for o in outs if o.token_ids and o.token_ids[0] == end]
    bad = {r["req_id"] for r in v["violations"]}
    assert len(bad) == len(changed), (bad, [o.token_ids for o in outs])
