"""The contract family's interface and each contract class's own table (no engine): every
contract registered once with a well-formed interface, the row steps in vLLM's processing
order, and per class its activity, row step, output check, validation and grid case."""

import dataclasses
import math

import pytest

from workbook.core import budget
from workbook.core import contracts as C
from workbook.core.contracts import NEG_INF, Outcome, Params, RowContext

M = budget.Markers(start=(10,), end=(11,), natural_end=(11,))
P, O = (1, 2, 3), (5, 6)  # prompt, committed output
FIELDS = {f.name for f in dataclasses.fields(Params)}
# vLLM's processing order of a row (the package docstring's table)
ORDER = ("allowed_token_ids", "logit_bias", "min_tokens", "penalties", "bad_words",
         "thinking_token_budget", "temperature")


@pytest.mark.parametrize("c", C.family(), ids=lambda c: c.name)
def test_interface(c):
    assert c.name and C.get(c.name) is c and type(c).__doc__
    assert set(c.reads) <= FIELDS, set(c.reads) - FIELDS
    assert set(c.stages) <= set(C.STAGES), set(c.stages) - set(C.STAGES)
    assert (c.step is None) != (c in C.ROW_ORDER)
    assert not c.active(Params(max_tokens=None))  # no parameter set: no contract binds
    c.validate(Params(), 4096, C.MAX_LOGPROBS)  # the defaults are valid for every contract
    if c.listed:  # a constraint of its own has a grid case
        assert c.case([0] * 16, lambda ids: "x") is not None


def test_registry_orders():
    names = [c.name for c in C.ROW_ORDER]
    assert [n for n in names if n in ORDER] == list(ORDER)
    assert C.CONSTRAINTS[0] == "thinking_token_budget"  # first in the catalogue
    assert C.CONSTRAINTS == tuple(c.name for c in C.catalogue())
    assert len(set(C.CONSTRAINTS)) == len(C.CONSTRAINTS) and "temperature" not in C.CONSTRAINTS


# (contract, params, row context, column, value in) -> (value out, changed)
ROWS = [
    ("allowed_token_ids", Params(allowed_token_ids=(7,)), RowContext(P, O), 8, 1.0, NEG_INF, True),
    ("allowed_token_ids", Params(allowed_token_ids=(7,)), RowContext(P, O), 7, 1.0, 1.0, False),
    ("logit_bias", Params(logit_bias={7: -2.0}), RowContext(P, O), 7, 1.0, -1.0, True),
    ("logit_bias", Params(logit_bias={7: -2.0}), RowContext(P, O), 8, 1.0, 1.0, False),
    ("min_tokens", Params(min_tokens=3, stop_token_ids=(9,)), RowContext(P, O), 9, 1.0, NEG_INF,
     True),  # output index 2 < 3
    ("min_tokens", Params(min_tokens=3, stop_token_ids=(9,)), RowContext(P, O, (4,), 1), 9, 1.0,
     1.0, False),  # a draft row at output index 3
    ("penalties", Params(repetition_penalty=2.0), RowContext(P, O), 2, 4.0, 2.0, True),
    ("penalties", Params(frequency_penalty=1.0), RowContext(P, O, (8, 8), 2), 8, 0.0, -2.0, True),
    ("penalties", Params(frequency_penalty=1.0), RowContext(P, O, (8, 8), 1), 8, 0.0, -1.0, True),
    ("penalties", Params(presence_penalty=1.0), RowContext(P, O), 9, 0.5, 0.5, False),
    ("bad_words", Params(bad_words=((6, 7),)), RowContext(P, O), 7, 1.0, NEG_INF, True),
    ("bad_words", Params(bad_words=((4, 7),)), RowContext(P, O, (4,), 1), 7, 1.0, NEG_INF, True),
    ("bad_words", Params(bad_words=((4, 7),)), RowContext(P, O, (4,), 0), 7, 1.0, 1.0, False),
    ("thinking_token_budget", Params(thinking_token_budget=0), RowContext((10,), (), (), 0, M),
     11, 0.5, 0.5, True),  # due at once: the forced column (the value is the fold's concern)
    ("thinking_token_budget", Params(thinking_token_budget=0), RowContext((10,), (), (), 0, M),
     4, 0.5, 0.5, False),
    ("thinking_token_budget", Params(thinking_token_budget=0), RowContext((10,), ()), 11, 0.5, 0.5,
     False),  # no markers: nothing judged
    ("temperature", Params(temperature=0.5), RowContext(P, O), 7, 1.0, 2.0, False),
    ("temperature", Params(temperature=0.5), RowContext(P, O), 7, NEG_INF, NEG_INF, False),
]


@pytest.mark.parametrize("name,p,ctx,col,x,want,changed", ROWS)
def test_row_step(name, p, ctx, col, x, want, changed):
    c = C.get(name)
    assert c.active(p)
    got, ch = c.row(p, ctx, col, x)
    assert ch == changed and (got == want or math.isclose(got, want))


def test_forced_column_skips_later_steps():
    p = Params(thinking_token_budget=0, temperature=0.5, logit_bias={11: 1.0})
    e = C.expected(p, RowContext((10,), (), (), 0, M), 11, 1.0)
    assert e.forced and e.by == ("logit_bias", "thinking_token_budget") and e.value == 2.0


# (contract, params, outcome) -> output indices of its breaches
OUTPUTS = [
    ("min_tokens", Params(min_tokens=2, stop_token_ids=(9,)), Outcome(output=[9, 1]), [0]),
    ("min_tokens", Params(min_tokens=2, stop_token_ids=(9,)),
     Outcome(output=[1], finish_reason="stop"), [1]),
    ("allowed_token_ids", Params(allowed_token_ids=(1,)), Outcome(output=[1, 2, 3]), [1]),
    ("bad_words", Params(bad_words=((1, 2),)), Outcome(output=[1, 2]), [1]),
    ("bad_words", Params(bad_words=((1, 2),)), Outcome(output=[2, 1]), []),
    ("stop", Params(stop_token_ids=(9,)), Outcome(output=[9, 1, 1]), [1]),
    ("stop", Params(stop_token_ids=(9,), min_tokens=2), Outcome(output=[9, 1, 1]), []),
    ("logprobs", Params(logprobs=1), Outcome(output=[1, 2], logprobs=[-1.0, -2.0],
                                              logprob_truth=[-1.0, -2.5]), [1]),
    ("logprobs", Params(logprobs=1), Outcome(output=[1, 2], logprobs=[-1.0]), [1]),
    ("thinking_token_budget", Params(thinking_token_budget=1),
     Outcome(prompt=(10,), output=[4, 4, 11], markers=M), [1]),
    ("thinking_token_budget", Params(thinking_token_budget=1),
     Outcome(prompt=(10,), output=[4, 11], markers=M), []),
    ("structured_output", Params(json_schema={}),
     Outcome(output=[1, 2], grammar={"start": 0, "fed": 1, "first_rejected": 1,
                                     "rejected_token": 2}), [1]),
    ("stop_strings", Params(stop_strings=("b",)),
     Outcome(output=[1, 2, 3], text="a", texts=["a", "ab", "abc"], finish_reason="stop"), [2]),
    ("prompt_logprobs", Params(prompt_logprobs=1),
     Outcome(prompt=(7, 8), prompt_logprobs=[None, {4: -1.0}]), [None]),
]


@pytest.mark.parametrize("name,p,o,at", OUTPUTS)
def test_check_output(name, p, o, at):
    got = C.get(name).check_output(p, o)
    assert [b.out_index for b in got] == at and all(b.contract == name for b in got)
    assert all("None" not in b.what for b in got)


# (contract, params, outcome) -> not judged?
UNJUDGED = [
    ("structured_output", Params(json_schema={}), Outcome(output=[1], finish_reason="length"),
     True),
    ("structured_output", Params(json_schema={}),
     Outcome(output=[1], finish_reason="stop", text="{}"), False),
    ("stop_strings", Params(stop_strings=("z",)), Outcome(texts=["a"]), True),
    ("stop_strings", Params(stop_strings=("a",)), Outcome(texts=["a"]), False),
    ("prompt_logprobs", Params(prompt_logprobs=1), Outcome(), True),
]


@pytest.mark.parametrize("name,p,o,unjudged", UNJUDGED)
def test_unjudged(name, p, o, unjudged):
    why = C.get(name).unjudged(p, o)
    assert bool(why) == unjudged and (why is None or "None" not in why)


# (contract, keywords) -> the parameter named
INVALID = [
    ("thinking_token_budget", {"thinking_token_budget": -3}, "thinking_token_budget"),
    ("min_tokens", {"min_tokens": 3, "max_tokens": 2}, "min_tokens"),
    ("logit_bias", {"logit_bias": {9999: 1.0}}, "logit_bias"),
    ("allowed_token_ids", {"allowed_token_ids": ()}, "allowed_token_ids"),
    ("bad_words", {"bad_words": ((),)}, "bad_words"),
    ("penalties", {"repetition_penalty": -1.0}, "repetition_penalty"),
    ("stop", {"stop_token_ids": (-1,)}, "stop_token_ids"),
    ("logprobs", {"logprobs_mode": "x"}, "logprobs_mode"),
    ("prompt_logprobs", {"prompt_logprobs": 99}, "prompt_logprobs"),
    ("stop_strings", {"stop_strings": ("",)}, "stop"),
    ("temperature", {"temperature": -0.1}, "temperature"),
    ("rank_filters", {"top_p": 0.5}, "top_p"),
]


@pytest.mark.parametrize("name,kw,param", INVALID)
def test_validate(name, kw, param):
    with pytest.raises(C.ContractError) as e:
        C.get(name).validate(Params(**kw), 4096, C.MAX_LOGPROBS)
    assert e.value.parameter == param
    with pytest.raises(C.ContractError):  # the composition names the same
        C.validate(Params(**kw), 4096)


def _params_of_case(kw: dict) -> Params:
    """A case's ``SamplingParams`` keywords as ``Params`` (bad words as token ids, the JSON
    schema under its ``Params`` name), ignore_eos as the grid sends them."""
    d = {"ignore_eos": True, "max_tokens": 16, **kw}
    if "bad_words" in d:
        d["bad_words"] = [(0,)] * len(d["bad_words"])
    so = d.pop("structured_outputs", None)
    if so:
        d["json_schema"] = so["json"]
    return Params.of(d)


@pytest.mark.parametrize("case", C.CASES)
def test_every_case_binds_its_contracts(case):
    kw = C.case_kwargs(case, [3, 4, 5, 6], lambda ids: "t" * len(ids))
    p = _params_of_case(kw)
    C.validate(p, 4096)
    for name in C.CASE_CONTRACTS.get(case, (case,)):
        assert name in p.constraints(), (case, name, p)


@pytest.mark.parametrize("name,p,markers,cols", [
    ("allowed_token_ids", Params(allowed_token_ids=(7, 8)), None, [7, 8]),
    ("logit_bias", Params(logit_bias={4: 1.0}), None, [4]),
    ("min_tokens", Params(min_tokens=1, stop_token_ids=(9,), eos_token_ids=(2,)), None, [2, 9]),
    ("bad_words", Params(bad_words=((1, 2), (3,))), None, [2, 3]),
    ("thinking_token_budget", Params(thinking_token_budget=1), M, [11]),
    ("thinking_token_budget", Params(thinking_token_budget=1), None, []),
    ("penalties", Params(presence_penalty=1.0), None, []),  # history columns: the evidence's
])
def test_columns(name, p, markers, cols):
    assert C.get(name).columns(p, markers) == cols
