"""The one budget rule (``workbook.core.budget``), table-driven; and its users agree with it.

Markers of the tiny models: ``<think>`` = 1, ``</think>`` = 3 here (any ids work). The guard's
Triton kernel, the rule's device twin, is checked against it and against vLLM's own forcing
kernel on random histories in ``tests/test_guard.py``.
"""

from __future__ import annotations

import pytest

from workbook.core.budget import Markers, judge, overall, reasoning_count

M = Markers(start=[1], end=[3])  # natural end defaults to the end marker
M2 = Markers(start=[1], end=[5, 6, 3], natural_end=[3])  # a multi-token forced end

# prompt, output, budget, markers -> expected index, actual index, honored
TABLE = [
    ("reported: prompt ends <think>\\n, budget 1", [9, 1, 0], [3, 0, 0], 1, M, 1 - 1, 0, True),
    ("budget 0 with one reasoning token", [9, 1, 0], [3, 0], 0, M, 0, 0, True),
    ("budget 1, </think> late", [9, 1, 0], [0, 3], 1, M, 0, 1, False),
    ("#54906: never emitted", [9, 1, 0], [0] * 32, 1, M, 0, -1, False),
    ("budget 3 at output 2", [9, 1, 0], [0, 0, 3, 0], 3, M, 2, 2, True),
    ("no budget", [9, 1, 0], [0, 0], None, M, None, -1, None),
    ("prompt not in reasoning", [9, 1, 0, 3], [0, 0], 1, M, None, -1, None),
    ("no start marker", [9, 0], [0, 3], 1, M, None, 1, None),
    ("natural end before the boundary", [9, 1], [0, 3, 0, 0, 0], 4, M, None, 1, None),
    ("stopped early (EOS) before the boundary", [9, 1, 0], [0, 7], 5, M, 4, -1, None),
    ("stopped right at the boundary with another token", [9, 1, 0], [0, 0, 7], 3, M, 2, -1,
     False),
    ("max_tokens cut inside a multi-token end", [9, 1, 0], [0, 5, 6], 2, M2, 1, -1, None),
    ("multi-token end complete", [9, 1, 0], [0, 5, 6, 3], 2, M2, 1, 1, True),
    ("a second start reopens reasoning", [1, 0, 3, 1, 0, 0], [3], 2, M, 0, 0, True),
    ("budget already exceeded by the prompt", [1, 0, 0, 0, 0], [0, 3], 2, M, 0, 1, False),
]


@pytest.mark.parametrize("name,prompt,output,budget,markers,exp,act,honored", TABLE,
                         ids=[t[0] for t in TABLE])
def test_budget_rule(name, prompt, output, budget, markers, exp, act, honored):
    j = judge(prompt, output, budget, markers)
    assert (j.expected_end_index, j.actual_end_index, j.honored) == (exp, act, honored)


@pytest.mark.parametrize("history,count", [
    ([5, 1, 0, 0], 2), ([5, 1], 0), ([5, 1, 0, 3, 0], None), ([5, 0, 0], None),
    ([1, 0, 3, 1, 0, 0, 0], 3),
])
def test_reasoning_count(history, count):
    assert reasoning_count(history, M) == count


def test_markers_from_every_source():
    class RC:  # vLLM's reasoning_config shape
        reasoning_start_token_ids = [1]
        reasoning_end_token_ids = [3]
        natural_reasoning_end_token_ids = []
    eff = {"reasoning_start_token_ids": [1], "reasoning_end_token_ids": [3],
           "natural_reasoning_end_token_ids": None}
    assert Markers.of(RC()) == Markers.of(eff) == Markers.of({"start": [1], "end": [3]}) == M
    assert M.natural_end == (3,) and M.complete and not Markers.of(None).complete


def test_overall_verdict():
    assert overall([True, None, False]) == "violated"
    assert overall([None, True]) == "honored"
    assert overall([None]) == overall([]) == "inconclusive"


def test_client_verdict_and_trace_diagnosis_agree_on_early_stop():
    """The two users of the rule agree where they used to differ (a request that stops early)."""
    from workbook.core.budget import judge_from_count

    prompt, output = [9, 1, 0], [0, 7]
    assert judge(prompt, output, 5, M) == judge_from_count(reasoning_count(prompt, M), output,
                                                            5, M)
    assert judge(prompt, output, 5, M).honored is None
