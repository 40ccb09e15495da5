"""The contracts of ``workbook.core.contracts``, table-driven (no engine)."""

import math

import pytest

from workbook.core import budget
from workbook.core.contracts import (NEG_INF, ContractError, GrammarTruth, Params, RowContext,
                                     check_output, check_prompt_logprobs, check_row,
                                     check_stop_strings, expected, first_divergence,
                                     must_hold_token, prompt_logprobs_divergence,
                                     stop_string_end, unjudged, unjudged_host, validate)

M = budget.Markers(start=(10,), end=(11,), natural_end=(11,))
P, O = (1, 2, 3), (5, 6)  # prompt, committed output

# (params, row context, column, raw) -> (value, forced, contracts that changed it)
ROWS = [
    (Params(), RowContext(P, O), 7, 1.5, 1.5, False, ()),
    (Params(allowed_token_ids=(7, 8)), RowContext(P, O), 9, 1.5, NEG_INF, False,
     ("allowed_token_ids",)),
    (Params(allowed_token_ids=(7, 8)), RowContext(P, O), 7, 1.5, 1.5, False, ()),
    (Params(logit_bias={7: 2.0}), RowContext(P, O), 7, 1.5, 3.5, False, ("logit_bias",)),
    (Params(logit_bias={7: -100.0}), RowContext(P, O, (4, 4), 2), 7, 0.25, -99.75, False,
     ("logit_bias",)),
    # min_tokens: output index = len(O) + j; masked while < min_tokens, stop and EOS alike
    (Params(min_tokens=4, stop_token_ids=(9,)), RowContext(P, O, (4,), 1), 9, 1.0, NEG_INF,
     False, ("min_tokens",)),
    (Params(min_tokens=4, eos_token_ids=(2,), ignore_eos=True), RowContext(P, O, (4, 4), 1), 2,
     1.0, NEG_INF, False, ("min_tokens",)),
    (Params(min_tokens=4, stop_token_ids=(9,)), RowContext(P, O, (4, 4), 2), 9, 1.0, 1.0,
     False, ()),
    # penalties: repetition on prompt or output columns, frequency/presence on output + drafts
    (Params(repetition_penalty=2.0), RowContext(P, O), 1, 3.0, 1.5, False, ("penalties",)),
    (Params(repetition_penalty=2.0), RowContext(P, O), 1, -3.0, -6.0, False, ("penalties",)),
    (Params(repetition_penalty=2.0), RowContext(P, O), 9, 3.0, 3.0, False, ()),
    (Params(frequency_penalty=0.5), RowContext(P, O, (5, 5), 2), 5, 1.0, -0.5, False,
     ("penalties",)),
    (Params(frequency_penalty=0.5), RowContext(P, O, (5, 5), 0), 5, 1.0, 0.5, False,
     ("penalties",)),
    (Params(presence_penalty=1.0), RowContext(P, O), 1, 1.0, 1.0, False, ()),  # prompt: no
    (Params(presence_penalty=1.0), RowContext(P, O, (8,), 1), 8, 1.0, 0.0, False,
     ("penalties",)),
    # bad words: single token always; multi-token once the output (+ drafts) ends in the prefix
    (Params(bad_words=((7,),)), RowContext(P, O), 7, 1.0, NEG_INF, False, ("bad_words",)),
    (Params(bad_words=((6, 7),)), RowContext(P, O), 7, 1.0, NEG_INF, False, ("bad_words",)),
    (Params(bad_words=((8, 7),)), RowContext(P, O, (8,), 1), 7, 1.0, NEG_INF, False,
     ("bad_words",)),
    (Params(bad_words=((8, 7),)), RowContext(P, O, (8,), 0), 7, 1.0, 1.0, False, ()),
    (Params(bad_words=((3, 7),)), RowContext(P, ()), 7, 1.0, 1.0, False, ()),  # prompt: no
    # the budget: budget.row_truth decides (prompt ends <think>: count 0 at the first row)
    (Params(thinking_token_budget=1), RowContext((1, 10), (), (4,), 1, M), 11, 0.0, 0.0, True,
     ("thinking_token_budget",)),
    (Params(thinking_token_budget=1), RowContext((1, 10), (), (4,), 0, M), 11, 0.0, 0.0, False,
     ()),
    # temperature divides the processed value
    (Params(temperature=0.5, logit_bias={7: 1.0}), RowContext(P, O), 7, 1.0, 4.0, False,
     ("logit_bias",)),
]


@pytest.mark.parametrize("p,ctx,col,raw,value,forced,by", ROWS)
def test_expected(p, ctx, col, raw, value, forced, by):
    e = expected(p, ctx, col, raw)
    assert (e.forced, e.by) == (forced, by)
    if not forced:
        assert e.value == value or math.isclose(e.value, value)


@pytest.mark.parametrize("p,ctx,col,raw,value,forced,by", ROWS)
def test_check_row_holds_and_breaks(p, ctx, col, raw, value, forced, by):
    good = 1e9 if forced else value
    assert check_row(p, ctx, {col: raw}, {col: good}) == []
    bad = raw if (by and not forced) else (0.0 if forced else raw + 1.0)
    breaches = check_row(p, ctx, {col: raw}, {col: bad})
    assert len(breaches) == 1 and breaches[0].column == col
    assert breaches[0].out_index == ctx.out_index
    if by:
        assert breaches[0].contract == by[-1]


def test_allowed_finite_count():
    p = Params(allowed_token_ids=(7, 8))
    assert check_row(p, RowContext(P, O), {}, {}, finite_count=2) == []
    [b] = check_row(p, RowContext(P, O), {}, {}, finite_count=3)
    assert b.contract == "allowed_token_ids"


@pytest.mark.parametrize("p,ctx,token,contract", [
    (Params(allowed_token_ids=(7,)), RowContext(P, O), 8, "allowed_token_ids"),
    (Params(min_tokens=3, stop_token_ids=(9,)), RowContext(P, O), 9, "min_tokens"),
    (Params(bad_words=((6, 7),)), RowContext(P, O), 7, "bad_words"),
    (Params(bad_words=((6, 7),)), RowContext(P, O, (6,), 1), 5, None),
])
def test_must_hold_token(p, ctx, token, contract):
    b = must_hold_token(p, ctx, token)
    assert (b.contract if b else None) == contract


# (params, output, finish_reason) -> contracts broken (first breach per contract)
OUTPUTS = [
    (Params(max_tokens=4), [1, 2, 3, 4], "length", []),
    (Params(max_tokens=4), [1, 2, 3, 4, 5], "length", ["max_tokens"]),
    (Params(stop_token_ids=(9,)), [1, 9], "stop", []),
    (Params(stop_token_ids=(9,)), [1, 9, 2, 3], "stop", ["stop"]),
    (Params(eos_token_ids=(2,)), [1, 2, 3], "stop", ["stop"]),
    (Params(eos_token_ids=(2,), ignore_eos=True), [1, 2, 3], "length", []),
    (Params(min_tokens=3, stop_token_ids=(9,)), [1, 9, 2, 3], "length", ["min_tokens"]),
    (Params(min_tokens=3, eos_token_ids=(2,), ignore_eos=True), [1, 2, 3], "length",
     ["min_tokens"]),
    (Params(min_tokens=3, stop_token_ids=(9,)), [1, 2, 3, 9], "stop", []),
    (Params(min_tokens=3, stop_token_ids=(9,)), [1, 2], "stop", ["min_tokens"]),
    (Params(allowed_token_ids=(1, 2)), [1, 2, 1], "length", []),
    (Params(allowed_token_ids=(1, 2)), [1, 3], "length", ["allowed_token_ids"]),
    (Params(bad_words=((5, 6),)), [5, 7, 6], "length", []),
    (Params(bad_words=((5, 6),)), [4, 5, 6], "length", ["bad_words"]),
    (Params(thinking_token_budget=1), [4, 11, 5], "length", []),
    (Params(thinking_token_budget=1), [4, 4, 11], "length", ["thinking_token_budget"]),
    (Params(json_schema={"type": "object"}), [1], "stop", ["structured_output"]),
]


@pytest.mark.parametrize("p,output,finish,broken", OUTPUTS)
def test_check_output(p, output, finish, broken):
    text = "{" if p.json_schema else None
    got = [b.contract for b in check_output(p, (1, 10), output, finish, M, text=text)]
    assert got == broken


@pytest.mark.parametrize("returned,truth,broken", [
    ([-1.0, -2.0], [-1.0, -2.0], []),
    ([-1.0, -2.0], [-1.0, -2.5], ["logprobs"]),
    ([-1.0], [-1.0, -2.0], ["logprobs"]),  # an entry missing
])
def test_check_output_logprobs(returned, truth, broken):
    got = check_output(Params(logprobs=1), (), [3, 4], logprobs=returned, logprob_truth=truth)
    assert [b.contract for b in got] == broken


@pytest.mark.parametrize("kw,param", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"allowed_token_ids": ()}, "allowed_token_ids"),
    ({"allowed_token_ids": (5000,)}, "allowed_token_ids"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"stop_token_ids": (4096,)}, "stop_token_ids"),
    ({"bad_words": ((),)}, "bad_words"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -2}, "logprobs"),
    ({"temperature": 3.0}, "temperature"),
    ({"thinking_token_budget": -2}, "thinking_token_budget"),
    ({"logprobs_mode": "nope"}, "logprobs_mode"),
    ({"min_p": 0.1}, "min_p"),
])
def test_validate_names_the_parameter(kw, param):
    with pytest.raises(ContractError) as e:
        validate(Params(**kw), vocab_size=4096)
    assert e.value.parameter == param and str(e.value).startswith(param)


def test_validate_accepts_every_constraint():
    validate(Params(min_tokens=2, stop_token_ids=(9,), logit_bias={1: 1.0},
                    allowed_token_ids=(1, 2), bad_words=((3, 4),), repetition_penalty=1.3,
                    presence_penalty=0.5, frequency_penalty=-0.5, logprobs=3,
                    thinking_token_budget=0), vocab_size=4096)


def test_params_of_dict_and_constraints():
    p = Params.of({"min_tokens": 2, "stop_token_ids": [9], "all_stop_token_ids": {9, 2},
                   "bad_words": [[3, 4]], "thinking_token_budget": -1, "max_tokens": 8})
    assert p.eos_token_ids == (2,) and p.thinking_token_budget is None
    assert p.constraints() == ["min_tokens", "bad_words", "stop", "max_tokens"]
    assert p.columns() == [2, 9, 4]


@pytest.mark.parametrize("a,b,idx", [([1, 2], [1, 2], None), ([1, 2], [1, 3], 1),
                                     ([1], [1, 2], 1)])
def test_first_divergence(a, b, idx):
    assert first_divergence(a, b) == idx


# ---- structured outputs: grammar evidence (contracts.GrammarTruth) ------------------------------
S = Params(json_schema={"type": "object"})
G = GrammarTruth


# (grammar evidence, finish_reason, text) -> (breached contracts, breach out_index)
GRAMMAR_OUTPUTS = [
    # every token accepted, ended by length: a valid prefix, holds
    (G(start=0, fed=4), "length", None, [], None),
    # reasoning first: the grammar starts after </think> at index 2
    (G(start=2, fed=2), "length", None, [], None),
    # the first token the grammar rejects is the breach, at its output index
    (G(start=0, fed=2, first_rejected=2, rejected_token=9), "length", None,
     ["structured_output"], 2),
    (G(start=2, fed=0, first_rejected=2, rejected_token=0), "length", None,
     ["structured_output"], 2),
    # finished by stop: the grammar must have reached its end (the stop token closed it)
    (G(start=0, fed=4, terminated=True, end=3), "stop", '{"a":1}', [], None),
    (G(start=0, fed=4), "stop", None, ["structured_output"], 4),
    # finished by stop, grammar terminated, yet the text does not parse: still a breach
    (G(start=0, fed=4, terminated=True, end=3), "stop", "{", ["structured_output"], 4),
    # no token went through the grammar: nothing to breach (unjudged says why)
    (G(start=None), "length", None, [], None),
]


@pytest.mark.parametrize("g,finish,text,broken,at", GRAMMAR_OUTPUTS)
def test_check_output_grammar(g, finish, text, broken, at):
    got = check_output(S, (1,), [5, 6, 7, 8], finish, M, text=text, grammar=g)
    assert [b.contract for b in got] == broken
    if broken:
        assert got[0].out_index == at
        assert "None" not in got[0].what
    # the same evidence as a dict (as grid.json / the evidence files hold it)
    assert [b.contract for b in check_output(S, (1,), [5, 6, 7, 8], finish, M, text=text,
                                             grammar=g.to_dict())] == broken


# (grammar evidence, no_grammar reason, finish_reason, text) -> judged?
UNJUDGED = [
    (G(start=0, fed=16), None, "length", None, True),  # a valid prefix is judged
    (G(start=2, fed=1), None, "length", None, True),
    (G(start=0, fed=0, first_rejected=0, rejected_token=0), None, "length", None, True),
    (G(start=None), None, "length", None, False),  # reasoning never ended: nothing constrained
    (G(start=16, fed=0), None, "length", None, False),  # </think> was the last token
    (None, "xgrammar does not import here", "length", None, False),
    (None, None, "stop", '{"a": 1}', True),  # no grammar evidence: the JSON check still ran
    (None, None, "stop", None, False),
]


@pytest.mark.parametrize("g,no_grammar,finish,text,judged", UNJUDGED)
def test_unjudged_structured_output(g, no_grammar, finish, text, judged):
    got = unjudged(S, [0] * 16, finish, text, grammar=g, no_grammar=no_grammar)
    assert ("structured_output" not in got) == judged
    for why in got.values():
        assert "None" not in why and why.endswith(("none", "ran"))
    if no_grammar and not judged:
        assert no_grammar in got["structured_output"]


def test_grammar_truth_judged():
    assert not G(start=None).judged and not G(start=3).judged
    assert G(start=0, fed=1).judged and G(start=0, first_rejected=0, rejected_token=0).judged
    assert G.of(G(start=1, fed=2).to_dict()) == G(start=1, fed=2)


# ---- stop strings: texts[i] is the decoded output[:i + 1] --------------------------------------
# (params, output, text, texts, finish) -> (completing index, contracts broken)
STOPS = [
    # "!!!" completes at index 2; tokens 3, 4 past it (a step's accepted drafts not trimmed)
    (Params(stop_strings=("!!!",)), [0, 0, 0], "", ["!", "!!", "!!!"], "stop", 2, []),
    (Params(stop_strings=("!!!",)), [0, 0, 0, 0, 0], "", ["!" * n for n in range(1, 6)],
     "stop", 2, ["stop_strings"]),
    # the text must end right before the stop string (include_stop_str_in_output False) ...
    (Params(stop_strings=("bc",)), [1, 2, 3], "a", ["a", "ab", "abc"], "stop", 2, []),
    (Params(stop_strings=("bc",)), [1, 2, 3], "abc", ["a", "ab", "abc"], "stop", 2,
     ["stop_strings"]),
    # ... or right after it (True); a token's text past the stop string is cut
    (Params(stop_strings=("bc",), include_stop_str_in_output=True), [1, 2, 3], "abc",
     ["a", "ab", "abcd"], "stop", 2, []),
    (Params(stop_strings=("bc",), include_stop_str_in_output=True), [1, 2, 3], "abcd",
     ["a", "ab", "abcd"], "stop", 2, ["stop_strings"]),
    (Params(stop_strings=("bc",), include_stop_str_in_output=True), [1, 2, 3], "abc",
     ["a", "abcd", "abcde"], "stop", 1, ["stop_strings"]),
    # min_tokens: an occurrence ending in the first min_tokens tokens' text does not count
    (Params(stop_strings=("ab",), min_tokens=2), [1, 2, 3, 4], "abx", ["a", "ab", "abx",
                                                                      "abxab"], "stop", 3,
     []),
    # the earliest completion wins, then the list's order
    (Params(stop_strings=("cd", "bcd")), [1, 2], "ab", ["ab", "abcd"], "stop", 1, []),
    # an incomplete UTF-8 character (U+FFFD at the end) is held back
    (Params(stop_strings=("é",)), [1, 2], "", ["\ufffd", "é"], "stop", 1, []),
    (Params(stop_strings=("zz",)), [1, 2], "ab", ["a", "ab"], "length", None, []),
    (Params(stop_strings=("b",)), [1, 2], "a", ["a", "ab"], "length", 1, ["stop_strings"]),
]


@pytest.mark.parametrize("p,output,text,texts,finish,at,broken", STOPS)
def test_stop_strings(p, output, text, texts, finish, at, broken):
    hit = stop_string_end(p, texts)
    assert (hit[0] if hit else None) == at
    got = check_stop_strings(p, output, text, texts, finish)
    assert sorted({b.contract for b in got}) == broken
    if len(output) > (at or 0) + 1 and at is not None:
        assert got[0].out_index == at + 1
    assert ("stop_strings" in unjudged_host(p, texts)) == (at is None)


# ---- prompt logprobs ----------------------------------------------------------------------------
PR = (7, 8, 9)
GOOD = [None, {8: -1.0, 4: -0.5}, {9: -2.0}]


@pytest.mark.parametrize("returned,truth,inputs,broken", [
    (GOOD, GOOD, [None, 7, 8], []),
    (GOOD[:2], GOOD, None, [None]),  # an entry missing: the list's length
    ([None, {4: -0.5}, {9: -2.0}], GOOD, None, [1]),  # the prompt's own token missing
    ([None, {8: -1.0, 4: -0.7}, {9: -2.0}], GOOD, None, [1]),  # a value not its row's
    ([None, {8: -1.0 + 5e-5}, {9: -2.0}], GOOD, None, []),  # within the tolerance
    (GOOD, GOOD, [None, 7, 9], [2]),  # position 2 computed from the row of the wrong token
    ([None, None, {9: -2.0}], GOOD, None, [1]),
    (None, GOOD, None, []),  # nothing returned: nothing to judge (unjudged_host says so)
])
def test_check_prompt_logprobs(returned, truth, inputs, broken):
    got = check_prompt_logprobs(PR, returned, truth, inputs)
    assert [q for q, _ in got] == broken
    assert all(b.contract == "prompt_logprobs" for _, b in got)
    p = Params(prompt_logprobs=1)
    assert ("prompt_logprobs" in unjudged_host(p, None, returned)) == (returned is None)


@pytest.mark.parametrize("got,ref,position", [
    (GOOD, GOOD, "same"),
    ([None, {8: -1.0 + 5e-5, 4: -0.5}, {9: -2.0}], GOOD, "same"),
    ([None, {8: -1.0, 4: -0.5}, {9: -2.1}], GOOD, 2),
    ([None, {8: -1.0, 5: -0.5}, {9: -2.0}], GOOD, "same"),  # a tie's other id, same value
    ([None, {8: -1.0, 5: -0.4}, {9: -2.0}], GOOD, 1),  # top-k values differ rank by rank
    (GOOD[:2], GOOD, None),
    (None, GOOD, None),
    (None, None, "same"),
])
def test_prompt_logprobs_divergence(got, ref, position):
    d = prompt_logprobs_divergence(got, ref)
    assert (d is None) == (position == "same")
    if d is not None:
        assert d["position"] == position and d["what"]


def test_params_of_host_side_parameters():
    p = Params.of({"stop": "!!", "include_stop_str_in_output": True, "prompt_logprobs": 0})
    assert p.stop_strings == ("!!",) and p.include_stop_str_in_output
    assert p.constraints() == ["prompt_logprobs", "stop_strings"]
    assert p.columns() == []  # neither names a logits column
    for kw, param in (({"prompt_logprobs": -2}, "prompt_logprobs"),
                      ({"prompt_logprobs": 21}, "prompt_logprobs"),
                      ({"stop_strings": ("a", "")}, "stop")):
        with pytest.raises(ContractError) as e:
            validate(Params(**kw), vocab_size=4096)
        assert e.value.parameter == param
