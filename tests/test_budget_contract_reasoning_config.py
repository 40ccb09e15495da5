"""The budget contract for every reasoning configuration vLLM accepts (``reasoning_start_str`` /
``reasoning_end_str``, several tokens each), table-driven, no engine: once the budget binds the
forced end string is due, in order, token by token, continuing a prefix of it the reasoning text
already holds (so it appears exactly once: vLLM 0.34.0's
``tests/v1/worker/test_gpu_thinking_budget.py::test_v2_thinking_budget_continues_end_prefix_from_prompt``
and its CPU twin; the expectations marked "continued" changed with it: they had the string
restarted); then no more reasoning; counting stops at the model's own natural end or at the end
of the forced string (``workbook.core.budget``'s docstring quotes vLLM's documentation and
test). Token ids: ``<think>`` = 1, ``\\n`` = 0, ``</think>``
= 3, transition-phrase tokens 5, 6, 7, 8.
"""

from __future__ import annotations

import pytest

from workbook.core.budget import Markers, forced_token, judge, row_truth

ONE = Markers(start=[1], end=[3])  # the parser's default: one token each
PHRASE = Markers(start=[1], end=[0, 5, 6, 0, 3], natural_end=[3])  # "\nOkay...\n</think>"
TAIL = Markers(start=[1], end=[3, 0, 0], natural_end=[3])  # "</think>\n\n"
NONAT = Markers(start=[1], end=[5, 6, 8], natural_end=[3])  # "Okay, done." (no </think>)
START2 = Markers(start=[1, 0], end=[3])  # reasoning_start_str "<think>\n"
P = [9, 1, 0]  # prompt ending "<think>\n": one reasoning token (ONE), none (START2)

# name, history, prompt_len, budget, markers -> due, token, ended
ROWS = [
    ("one token: due at the budget", P + [7], 3, 2, ONE, True, 3, None),
    ("one token: not yet", P, 3, 2, ONE, False, None, None),
    ("one token: prompt over budget binds at output 0", P, 3, 0, ONE, True, 3, None),
    ("phrase: binds with end[0]", P + [7], 3, 2, PHRASE, True, 0, None),
    ("phrase: continues token by token", P + [7, 0, 5], 3, 2, PHRASE, True, 6, None),
    ("phrase: the last token", P + [7, 0, 5, 6, 0], 3, 2, PHRASE, True, 3, None),
    ("phrase: whole string emitted, reasoning over", P + [7, 0, 5, 6, 0, 3], 3, 2, PHRASE,
     False, None, "forced"),
    ("phrase: a prefix the prompt wrote is continued", P, 3, 1, PHRASE, True, 5, None),
    ("phrase: a prefix the model wrote before binding is continued", P + [0], 3, 2, PHRASE,
     True, 5, None),
    ("phrase: prompt over the budget, the prompt's '\\n' continued", P, 3, 0, PHRASE, True, 5,
     None),
    ("phrase: a prefix written earlier, then other reasoning, is not continued", P + [0, 7], 3,
     3, PHRASE, True, 0, None),
    ("tail: the natural end inside the forced string does not stop it", P + [7, 3], 3, 2,
     TAIL, True, 0, None),
    ("tail: ... to its last token", P + [7, 3, 0], 3, 2, TAIL, True, 0, None),
    ("tail: whole string emitted", P + [7, 3, 0, 0], 3, 2, TAIL, False, None, "forced"),
    ("tail: the model's own natural end before binding ends it", P + [3], 3, 5, TAIL, False,
     None, "natural"),
    ("no natural end in the string: forced string ends reasoning", P + [7, 5, 6, 8], 3, 2,
     NONAT, False, None, "forced"),
    ("no natural end: nothing due after, however long", P + [7, 5, 6, 8, 7, 7, 7], 3, 2, NONAT,
     False, None, "forced"),
    ("deviation: a missed end stays due (from end[0])", P + [7, 7, 7], 3, 2, PHRASE, True, 0,
     None),
    ("start of two tokens: its tokens are not counted", P, 3, 0, START2, True, 3, None),
    ("start of two tokens: budget 1 not yet bound", P, 3, 1, START2, False, None, None),
    ("start of two tokens: budget 1 binds after one token", P + [7], 3, 1, START2, True, 3,
     None),
    ("no budget: never due", P + [7] * 9, 3, None, PHRASE, False, None, None),
    ("not in reasoning", [9, 7], 2, 0, PHRASE, False, None, "none"),
]


@pytest.mark.parametrize("name,history,plen,budget,markers,due,token,ended", ROWS,
                         ids=[r[0] for r in ROWS])
def test_row_truth(name, history, plen, budget, markers, due, token, ended):
    t = row_truth(history, [], 0, budget, markers, prompt_len=plen)
    assert (t.due, t.token, t.ended) == (due, token, ended)


def test_draft_rows_continue_the_string():
    """Row j of a step sees the history plus drafts[:j]: a multi-token end forced across the
    rows of one step is due token by token, as across steps."""
    h, drafts = P + [7], [0, 5, 6, 0]
    assert [row_truth(h, drafts, j, 2, PHRASE, 3).token for j in range(5)] == [0, 5, 6, 0, 3]


# name, prompt, output, budget, markers, forced -> honored, kind, at
JUDGE = [
    ("phrase forced whole where due", P, [7, 0, 5, 6, 0, 3, 7], 2, PHRASE, [1, 2, 3, 4, 5],
     True, None, None),
    ("phrase continued from a prefix the prompt wrote (continued)", P, [5, 6, 0, 3, 7], 1,
     PHRASE, [0, 1, 2, 3], True, None, None),
    ("phrase continued from a prefix the model wrote before binding (continued)", P,
     [0, 5, 6, 0, 3, 7], 2, PHRASE, [1, 2, 3, 4], True, None, None),
    ("phrase restarted after a prefix the prompt wrote: its first token twice", P,
     [0, 5, 6, 0, 3, 7], 1, PHRASE, [0, 1, 2, 3, 4], False, "missing", 0),
    ("tail after the natural end not forced", P, [7, 3, 7, 7], 2, TAIL, [1], False, "missing",
     1),
    ("tail forced whole", P, [7, 3, 0, 0, 7], 2, TAIL, [1, 2, 3], True, None, None),
    ("string without natural end forced again", P, [7, 5, 6, 8, 5, 6, 8], 2, NONAT,
     [1, 2, 3, 4, 5, 6], False, "twice", 4),
    ("string without natural end forced once", P, [7, 5, 6, 8, 7, 7], 2, NONAT, [1, 2, 3],
     True, None, None),
    ("phrase forced before the budget", P, [0, 5, 6, 0, 3], 3, PHRASE, [0, 1, 2, 3, 4], False,
     "early", 0),
    ("model's own natural end before binding, then nothing forced", P, [3, 7, 7], 2, TAIL, [],
     None, None, None),
    ("output cut inside the forced string", P, [7, 0, 5], 2, PHRASE, [1, 2], None, None, None),
    ("start of two tokens, budget 0: end at output 0", P, [3, 7], 0, START2, [0], True, None,
     None),
]


@pytest.mark.parametrize("name,prompt,output,budget,markers,forced,honored,kind,at", JUDGE,
                         ids=[t[0] for t in JUDGE])
def test_judge(name, prompt, output, budget, markers, forced, honored, kind, at):
    j = judge(prompt, output, budget, markers, forced)
    assert (j.honored, j.kind, j.at) == (honored, kind, at)


def test_vllm_kernel_choice_differs_only_after_the_whole_string():
    """``forced_token`` (vLLM's kernel's choice, the guard's twin) agrees with the promise
    while reasoning lasts — also where a prefix of the end string stands before the binding
    position (continued: vLLM's test_v2_thinking_budget_continues_end_prefix_from_prompt) —
    and differs once the whole string without the natural end was emitted (the rule forces
    nothing more)."""
    assert forced_token(P + [7], PHRASE) == row_truth(P + [7], [], 0, 2, PHRASE, 3).token
    assert forced_token(P + [0], PHRASE) == 5 == row_truth(P + [0], [], 0, 2, PHRASE, 3).token
    h = P + [7, 5, 6, 8]
    assert forced_token(h, NONAT) == 5 and not row_truth(h, [], 0, 2, NONAT, 3).due


# ---- RunConfig: the reasoning configuration is validated before any engine starts ---------

@pytest.mark.parametrize("kw,named", [
    ({"reasoning_end_str": ""}, "reasoning_end_str=''"),
    ({"reasoning_start_str": 7}, "reasoning_start_str=7"),
    ({"reasoning_parser": "", "reasoning_end_str": "</think>"}, "needs both"),
])
def test_bad_reasoning_config_is_named(kw, named):
    from workbook.core.config import ConfigError, RunConfig, validate

    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        validate(RunConfig(**kw))


def test_reasoning_config_reaches_the_engine_arguments():
    from workbook.core.config import RunConfig, validate, vllm_reasoning_fields
    from workbook.vllm.engine import engine_kwargs

    assert vllm_reasoning_fields() == ("reasoning_start_str", "reasoning_end_str")
    cfg = validate(RunConfig(reasoning_end_str="\nOkay, I'm done thinking.\n</think>"))
    assert engine_kwargs(cfg)["reasoning_config"] == {
        "reasoning_end_str": "\nOkay, I'm done thinking.\n</think>"}
    assert "reasoning_config" not in engine_kwargs(RunConfig())
