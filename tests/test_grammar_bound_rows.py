"""Which rows the grammar binds (``contracts.grammar_bound_rows``), on the real engine: MTP with
chunked prefill (prompts of ~190 tokens, 64 tokens a step) and async scheduling kept on on the
CPU — the two shapes the H100 run of vLLM 0.34.0 showed as false grammar violations
(outputs/h100/hunt-0.34.0-20261206/README.md):

- a prefill chunk short of the prompt's end samples nothing, and vLLM leaves its request out of
  that step's grammar bitmask (``Scheduler.get_grammar_bitmask``: ``not req.is_prefill_chunk``):
  its row has every column finite;
- with drafts accepted (the drafter steered to the target's own output), async scheduling runs
  one more step for a request that already reached ``max_tokens``; its bitmask is computed once
  the request has finished (no mask row) and what it samples is discarded.

Both hold here, both shapes really happen (asserted from the evidence), the output is a valid
prefix of the grammar, and the grammar fault is still caught under chunked prefill."""

import pytest

from workbook.core import contracts
from workbook.run.constraints import axes as A
from workbook.run.constraints import cases as C
from workbook.run.constraints import grid as G

NAME = "structured_output"


@pytest.fixture(scope="module")
def setup():
    from workbook.vllm import engine as vengine

    p = G.plan("constraints", only="hunt", methods=["mtp"], on_cpu=True)
    cfg = A.config(G.config_for("mtp"), p.axes, {"chunked_prefill": "on"}).replace(
        async_scheduling=True, async_on_cpu=True)
    eng = vengine.start(cfg)
    yield eng, cfg
    eng.shutdown()


def _send(eng, cfg, **kw):
    kwargs = C.case_kwargs(NAME, [0] * 16, eng.tokenizer.decode)
    cells, ev = C.run_batch(eng, {NAME: kwargs}, zero_head=True, batch="single", cfg=cfg, **kw)
    return cells[NAME], ev[NAME]


def _unmasked(row, vocab=4096):
    return row["finite"] == vocab


def test_prefill_chunks_and_the_step_past_max_tokens_are_not_bound(setup):
    eng, cfg = setup
    from workbook.vllm import async_shim

    assert async_shim.effective(eng.llm) is True  # the engine core has a batch queue
    cell, ev = _send(eng, cfg)
    assert cell.status == "holds", (cell.first, cell.message)
    assert cell.grammar["first_rejected"] is None and cell.grammar["fed"] == len(cell.output)
    chunks = [s for s in ev["steps"] if not s["emitted"]]
    assert chunks and all(_unmasked(r) for s in chunks for r in s["rows"]), \
        "no prefill chunk ran unmasked: the shape was not exercised"
    bound = list(contracts.grammar_bound_rows(ev["steps"], ev["req_id"], len(cell.output)))
    assert not {id(s) for s in chunks} & {id(s) for s, _ in bound}

    # drafts accepted: async scheduling runs a step past max_tokens, unmasked
    steered, ev2 = _send(eng, cfg, steer_plans={NAME: cell.output})
    assert steered.status == "holds", (steered.first, steered.message)
    assert steered.output == cell.output and steered.accepted_drafts > 0
    past = [s for s in ev2["steps"] if s["committed_before"] >= len(steered.output)]
    assert past and _unmasked(past[0]["rows"][0]), \
        "no step ran past max_tokens: async scheduling's extra step was not exercised"
    kept = list(contracts.grammar_bound_rows(ev2["steps"], ev2["req_id"], len(steered.output)))
    assert sum(len(rows) for _, rows in kept) >= len(steered.output)
    assert all(s["committed_before"] < len(steered.output) for s, _ in kept)


def test_grammar_fault_still_caught_under_chunked_prefill(setup):
    eng, cfg = setup
    cell, ev = _send(eng, cfg, fault="grammar-skipped-once")
    assert cell.status == "violated", (cell.status, cell.message)
    assert cell.first["stage"] == "grammar bitmask" and cell.first["out_index"] == 0
    step = next(s for s in ev["steps"] if s["step"] == cell.first["step"])
    assert step["emitted"], "judged on a step that sampled nothing"


def test_rejudge_committed_cpu_runs(capsys):
    """scripts/rejudge_grammar.py over the committed CPU runs made before the rule: the two
    chunked-prefill cells and the two async cells past max_tokens held now, nothing else
    changes; a folder that is not a run is one line, rc 2."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("rejudge_grammar", os.path.join(
        "scripts", "rejudge_grammar.py"))
    rj = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rj)
    root = os.path.join("outputs", "cpu", "gputriage-0.32.0")
    got = {d: rj.rejudge(os.path.join(root, d)) for d in (
        "before-chunked-prefill", "before-structured-after-reasoning-async-on",
        "before-structured-after-reasoning-async-off")}
    assert got["before-chunked-prefill"] == {"cells": 2, "violated before": 2, "violated now": 0}
    assert got["before-structured-after-reasoning-async-on"]["violated before"] == 2
    assert got["before-structured-after-reasoning-async-on"]["violated now"] == 0
    assert got["before-structured-after-reasoning-async-off"]["violated before"] == 0
    assert got["before-structured-after-reasoning-async-off"]["violated now"] == 0
    assert rj.main(["/nonexistent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rejudge_grammar: not a grid run folder: /nonexistent"]
