"""The constraints machinery on the real engine (one MTP engine for the module): healthy vLLM
gives no false alarm on any constraint, draft rows are checked, and each constraint fault is
caught at its contract and stage (``workbook.hooks.constraint_faults``)."""

import pytest

from workbook.core import contracts
from workbook.hooks import constraint_faults
from workbook.run import constraints as C

# faults whose request binds on the zeroed lm_head with MTP drafts accepted
FAULT_CASES = {"bias-target-row-only": "allowed_token_ids", "gate-off": "penalties",
               "penalties-drafts-uncounted": "penalties", "stop-not-trimmed": "stop",
               "logprobs-row-shift": "logprobs", "min-tokens-off-by-one": "min_tokens"}


@pytest.fixture(scope="module")
def engine():
    from workbook.vllm import engine as vengine

    eng = vengine.start(C.config_for("mtp"))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def cases(engine):
    tok = engine.tokenizer
    return {c: C.case_kwargs(c, [0] * 16, tok.decode) for c in contracts.CONSTRAINTS}


def test_healthy_mixed_batch_no_false_alarm(engine, cases):
    ok = {c: kw for c, kw in cases.items() if c != "logit_bias"}  # refused with spec (0.32)
    cells, ev = C.run_batch(engine, ok, zero_head=True, batch="mixed")
    # a structured output cut by max_tokens is "not judged" (contracts.unjudged), never held
    bad = {c: (cl.status, cl.first, cl.message) for c, cl in cells.items()
           if cl.status != "holds" and not (cl.status == "not judged" and cl.finish_reason
                                             != "stop" and c == "structured_output")}
    assert not bad
    assert sum(cl.draft_rows for cl in cells.values()) > 0
    assert sum(cl.accepted_drafts for cl in cells.values()) > 0


def test_logit_bias_refused_with_spec_names_vllms_message(engine, cases):
    cells, _ = C.run_batch(engine, {"logit_bias": cases["logit_bias"]}, zero_head=True,
                           batch="single")
    assert cells["logit_bias"].status == "refused"
    assert "logit_bias" in cells["logit_bias"].message


@pytest.mark.parametrize("fault", [pytest.param(
    f, marks=pytest.mark.xfail(reason="not caught yet: the row's logprob evidence does not see "
                               "the shifted tensor (open)", strict=False))
    if f == "logprobs-row-shift" else f for f in sorted(FAULT_CASES)])
def test_fault_caught_at_its_contract_and_stage(engine, cases, fault):
    c = FAULT_CASES[fault]
    # logprobs: on the zeroed lm_head every row's log-softmax is the same; use the weights
    zero = fault != "logprobs-row-shift"
    cells, _ = C.run_batch(engine, {c: cases[c]}, zero_head=zero, batch="single", fault=fault)
    cell = cells[c]
    contract, stage = constraint_faults.EXPECTED[fault]
    assert cell.status == "violated", (cell.status, cell.message)
    stages = stage if isinstance(stage, tuple) else (stage,)
    assert cell.first["contract"] == contract and cell.first["stage"] in stages, cell.first
    assert cell.first["step"] is not None and cell.first["row"] is not None


def test_bad_case_rejected_before_engine():
    with pytest.raises(contracts.ContractError) as e:
        C.validate_case("penalties", {"presence_penalty": 3.0}, 4096)
    assert e.value.parameter == "presence_penalty"
