"""vLLM's own unit tests as the statement of intent: every assertion of vLLM 0.34.0's tests about a
component's output that a contract states, as a table case (``tests/data/vllm_intent_cases.yaml``:
the vLLM file and test function, the inputs, what vLLM asserts, the contract), run through the
contract's own functions — ``contracts.expected`` per column for a logits row, ``validate`` /
``Params.of`` for a parameter, ``contracts.gated`` for the sampler's per-request gate,
``expected_logprob`` for a returned logprob, ``check_output`` for an output. No engine: the vLLM
tests build the states directly, so do these. A case whose contract disagreed says how it was
decided (``decided``); the assertions no contract expresses are listed in the file with why.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from workbook.core import budget, contracts
from workbook.core.contracts import ContractError, Params, RowContext
from workbook.core.contracts.masks import stop_only

DATA = yaml.safe_load((Path(__file__).parent / "data" / "vllm_intent_cases.yaml").read_text())
CASES = DATA["cases"]
NEG = float("-inf")


def _num(v) -> float:
    return NEG if v == "-inf" else float(v)


def _params(d: dict) -> Params:
    return Params(**{k: (tuple(v) if k == "bad_words" else v) for k, v in d.items()})


def _raw(spec, vocab: int) -> list[float]:
    """A raw logits row from the case's spec (module docstring of the data file)."""
    if spec == "zeros":
        row = [0.0] * vocab
    elif spec == "arange":
        row = [float(c) for c in range(vocab)]
    elif "arange" in spec:
        row = [float(spec["arange"] + c) for c in range(vocab)]
    elif "linspace" in spec:
        import numpy as np
        lo, hi = spec["linspace"]
        row = [float(x) for x in np.linspace(lo, hi, vocab, dtype=np.float32)]
    else:
        row = [_num(spec.get("fill", 0.0))] * vocab
    if isinstance(spec, dict):
        for c, v in (spec.get("at") or {}).items():
            row[int(c)] = _num(v)
    return row


def _same(a: float, b: float) -> bool:
    return contracts.close(a, b)


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "row"],
                         ids=lambda c: c["id"])
def test_row(case):
    """The processed row the contract predicts is the one vLLM's test asserts, column by
    column (``contracts.expected``, every active contract folded in vLLM's processing order)."""
    p = _params(case["params"])
    markers = budget.Markers.of(DATA["markers"][case["markers"]]) if "markers" in case \
        else budget.Markers()
    vocab = case["vocab"]
    raw = _raw(case["raw"], vocab)
    drafts = tuple(case["drafts"])
    assert len(case["rows"]) == len(drafts) + 1 or not drafts
    for j, want in enumerate(case["rows"]):
        ctx = RowContext(tuple(case["prompt"]), tuple(case["output"]), drafts, j, markers)
        if p.min_tokens and p.json_schema is not None:
            ctx = RowContext(ctx.prompt, ctx.output, drafts, j, markers,
                             stop_only(p, ctx, dict(enumerate(raw))))
        forced = {int(c) for c in want.get("forced", ())}
        values = {int(c): _num(v) for c, v in (want.get("values") or {}).items()}
        rest = want.get("rest")
        for col in range(vocab):
            e = contracts.expected(p, ctx, col, raw[col])
            where = f"{case['id']}: row {j}, column {col}"
            if col in forced:
                assert e.forced, f"{where}: vLLM forces it, the contract does not ({e})"
                continue
            assert not e.forced, f"{where}: the contract forces it, vLLM does not"
            if col in values:
                assert _same(e.value, values[col]), f"{where}: vLLM {values[col]}, contract {e}"
            elif rest == "raw":
                assert _same(e.value, raw[col]), f"{where}: vLLM leaves it raw, contract {e}"
            elif rest == "-inf":
                assert e.value == NEG, f"{where}: vLLM -inf, contract {e}"


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "validate"],
                         ids=lambda c: c["id"])
def test_validate(case):
    """What vLLM's ``SamplingParams`` accepts or refuses, both ways into the family:
    ``Params(**kw)`` and ``Params.of(dict)`` (the worker's and the grid's), then ``validate``
    naming the parameter; an accepted budget normalised as vLLM does (-1: no budget)."""
    vocab = case.get("vocab_size", 4096)
    max_lp = case.get("max_logprobs", contracts.MAX_LOGPROBS)
    for p in (_params(case["params"]), Params.of(dict(case["params"]))):
        if case["expect"] == "accept":
            contracts.validate(p, vocab, max_lp)
            if "budget" in case:
                assert p.thinking_token_budget == case["budget"]
        else:
            with pytest.raises(ContractError) as e:
                contracts.validate(p, vocab, max_lp)
            assert e.value.parameter == case["parameter"]


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "gate"],
                         ids=lambda c: c["id"])
def test_gate(case):
    """vLLM's per-request ``needs_logits_processing`` is the family's ``gated``: a request whose
    contracts change rows inside ``apply_sampling_params`` must pass the gate."""
    assert bool(contracts.gated(_params(case["params"]))) is case["expect"]


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "logprob"],
                         ids=lambda c: c["id"])
def test_logprob(case):
    for e in case["entries"]:
        got = contracts.expected_logprob(case["mode"], e["value"], e["lse"])
        assert math.isclose(got, e["expect"], rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "output"],
                         ids=lambda c: c["id"])
def test_output(case):
    p = _params(case["params"])
    found = contracts.check_output(p, case.get("prompt", ()), case["output"],
                                   case.get("finish_reason"), grammar=case.get("grammar"))
    assert sorted({b.contract for b in found}) == sorted(case["expect"])


def test_every_case_names_its_vllm_test_and_contract():
    """Each case cites a vLLM test function at 0.34.0 and a contract of the family (or the
    family itself, for the gate); ids are unique; a decided case says who was right."""
    names = {c.name for c in contracts.family()} | {"family"}
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    for c in CASES:
        assert c["file"].startswith("tests/") and c["test"].startswith("test")
        assert c["contract"] in names, c["id"]
        assert c["asserts"], c["id"]
        if "decided" in c:
            assert c["decided"].startswith("contract wrong") or \
                c["decided"].startswith("vLLM wrong"), c["id"]
    for n in DATA["not_expressed"]:
        assert n["why"] and n["why"] != "UNCLASSIFIED", n["test"]


def test_stop_only_from_the_row_checks_kept_columns():
    """Rule B on the row check's evidence (``rowjudge``: the raw row's kept columns hold its
    top-K): the grammar's end is all that is left only when every kept column but the stop
    columns is -inf and the top-K could not all be stop columns."""
    p = Params(min_tokens=10, stop_token_ids=(3,), json_schema={"type": "boolean"})
    ctx = RowContext((10, 11), (0, 0, 0, 0))
    assert stop_only(p, ctx, {3: 1.0, 0: NEG, 7: NEG, 9: NEG}, k=4)
    assert not stop_only(p, ctx, {3: 1.0, 4: 2.0, 7: NEG, 9: NEG}, k=4)
    many = Params(min_tokens=10, stop_token_ids=(3, 4, 5, 6), json_schema={"type": "boolean"})
    assert not stop_only(many, ctx, {3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0}, k=4)  # unsure: masks
    assert not stop_only(Params(min_tokens=10, stop_token_ids=(3,)), ctx, {3: 1.0, 0: NEG}, k=4)
    # logit_bias cannot revive a -inf column; allowed_token_ids can remove a finite one
    allowed = Params(min_tokens=10, stop_token_ids=(3,), allowed_token_ids=(3,),
                     json_schema={"type": "boolean"})
    assert stop_only(allowed, ctx, {3: 1.0, 4: 2.0}, k=4)
