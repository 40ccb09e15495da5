"""``workbook.vllm.grammar``: where vLLM starts a request's grammar, and the emitted tokens
through it (xgrammar and the tiny model's tokenizer; no engine)."""

import pytest

from workbook.core import budget
from workbook.core.contracts import GrammarTruth

xgr = pytest.importorskip("xgrammar")

from workbook.vllm import grammar as G  # noqa: E402

M = budget.Markers(start=(368,), end=(369,))
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
EOS = 367
# '{"a":1}' in the tiny tokenizer's ids: { " a " : 1 }
OBJ = [90, 1, 64, 1, 25, 16, 92]


@pytest.mark.parametrize("prompt,output,reasoning,start", [
    ((1, 368, 198), (0, 369, 90), False, 0),  # no reasoning parser: from the first token
    ((1, 368, 198), (0, 369, 90), True, 2),  # the token after </think>
    ((1, 368, 198), (0, 0, 369), True, 3),  # </think> last: the grammar starts at the end
    ((1, 368, 198), (0, 0, 0), True, None),  # the reasoning never ends
    ((1, 368, 198, 369, 198), (90,), True, 0),  # the prompt ends the reasoning
    ((369, 1, 368, 198), (0, 369), True, 2),  # an end marker before the last start: not ended
])
def test_grammar_start(prompt, output, reasoning, start):
    assert G.grammar_start(prompt, output, M, reasoning) == start


# reasoning_end_str "Okay, done." (no </think>) and "</think>\n\n": the grammar starts where the
# parser's natural end (</think>, 369) is, never at a token of the configured phrase
PHRASE = budget.Markers(start=(368,), end=(46, 74, 64, 88, 11, 327, 77, 68, 13), natural_end=(369,))
AFTER = budget.Markers(start=(368,), end=(369, 198, 198), natural_end=(369,))


@pytest.mark.parametrize("markers,output,start", [
    (PHRASE, (46, 74, 64, 88, 11, 327, 77, 68, 13, 90), None),  # the phrase alone: not ended
    (PHRASE, (46, 74, 369, 90), 3),  # the parser's end after part of the phrase
    (AFTER, (369, 773, 90), 1),  # right after </think>, whatever the forced string's rest
    (AFTER, (198, 198, 90), None),  # the forced string's newlines are not an end
])
def test_grammar_starts_at_the_parsers_natural_end(markers, output, start):
    assert G.grammar_start((1, 368, 198), output, markers, True) == start


@pytest.fixture(scope="module")
def checker():
    from transformers import AutoTokenizer

    from workbook.core import models

    tok = AutoTokenizer.from_pretrained(models.build("tiny-mimo-mtp"))
    assert tok.decode(OBJ) == '{"a":1}'
    return G.Checker(tok, models.VOCAB, SCHEMA, [EOS])


@pytest.mark.parametrize("output,truth", [
    (OBJ[:4], GrammarTruth(start=0, fed=4)),  # a valid prefix
    (OBJ + [EOS], GrammarTruth(start=0, fed=8, terminated=True, end=7)),  # EOS closes it
    (OBJ + [EOS, 0, 0], GrammarTruth(start=0, fed=8, terminated=True, end=7)),  # after: free
    ([90, 90], GrammarTruth(start=0, fed=1, first_rejected=1, rejected_token=90)),
    ([EOS], GrammarTruth(start=0, fed=0, first_rejected=0, rejected_token=EOS)),  # not yet
])
def test_truth(checker, output, truth):
    assert checker.truth((1, 368, 198, 369), output, M, True) == truth


def test_truth_after_reasoning_and_allowed(checker):
    t = checker.truth((1, 368, 198), [0, 369, 90, 90], M, True)
    assert (t.start, t.first_rejected, t.rejected_token) == (2, 3, 90)
    assert checker.allowed([], 90) is True and checker.allowed([], 0) is False
    assert checker.allowed_mask([]).sum() == 1  # only '{' opens the object
    assert checker.allowed([90, 90], 1) is None  # a rejected prefix: no state to judge by
