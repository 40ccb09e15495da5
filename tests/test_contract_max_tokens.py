"""The max_tokens contract's table (no engine): at most max_tokens tokens and logprob entries,
nothing past the cap even inside a step's accepted drafts, "length" when the cap ended it."""

import pytest

from workbook.core import contracts as C
from workbook.core.contracts import Outcome, Params

MT = C.get("max_tokens")


# (params, outcome) -> (breach output indices, not judged?)
TABLE = [
    (Params(max_tokens=6), Outcome(output=[0] * 6, finish_reason="length"), [], False),
    # the cap at index 6 falls inside step 2's accepted drafts (6-8): all three kept
    (Params(max_tokens=6), Outcome(output=[0] * 9, finish_reason="length"), [6], False),
    (Params(max_tokens=6, logprobs=1), Outcome(output=[0] * 6, finish_reason="length",
                                               logprobs=[-1.0] * 7), [6], False),
    # reached the cap with no stop token, reported "stop"
    (Params(max_tokens=3), Outcome(output=[1, 2, 3], finish_reason="stop"), [2], False),
    # ... unless a stop token, a stop string or the grammar ended it there
    (Params(max_tokens=3, stop_token_ids=(3,)), Outcome(output=[1, 2, 3], finish_reason="stop"),
     [], False),
    (Params(max_tokens=3, stop_strings=("x",)), Outcome(output=[1, 2, 3], finish_reason="stop"),
     [], False),
    # ended before the cap: nothing to breach, the cap never exercised
    (Params(max_tokens=6, stop_token_ids=(2,)), Outcome(output=[1, 2], finish_reason="stop"), [],
     True),
    (Params(max_tokens=6), Outcome(output=[1, 2], finish_reason="length"), [], True),
]


@pytest.mark.parametrize("p,o,at,unjudged", TABLE)
def test_max_tokens(p, o, at, unjudged):
    got = MT.check_output(p, o)
    assert [b.out_index for b in got] == at and all("None" not in b.what for b in got)
    assert bool(MT.unjudged(p, o)) == unjudged
    # the family's compositions carry it
    assert [b.out_index for b in C.check_output(p, (), o.output, o.finish_reason,
                                                logprobs=o.logprobs) if b.contract == MT.name] == at
    assert ("max_tokens" in C.unjudged(p, o.output, o.finish_reason)) == unjudged


def test_max_tokens_is_its_own_contract():
    assert "max_tokens" in Params(max_tokens=4).constraints()
    assert "stop" not in Params(max_tokens=4, ignore_eos=True).constraints()
    assert C.case_kwargs("max_tokens", [0] * 16, str) == {"max_tokens": 6}
    with pytest.raises(C.ContractError) as e:
        C.validate(Params(max_tokens=0, min_tokens=3), 4096)
    assert e.value.parameter == "max_tokens"
