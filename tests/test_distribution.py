"""The distribution oracle's statistics (workbook.run.constraints.distribution), no engine: table tests of the
goodness-of-fit, the two-sample test, Holm, the contracts' predicted rows and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from workbook.core import contracts
from workbook.core.config import ConfigError
from workbook.run.constraints import distribution as D


def _draw(p, n, rng):
    return [[int(t)] for t in rng.choice(len(p), size=n, p=p)]


@pytest.mark.parametrize("pvals,want", [
    ([0.001, 0.2, 0.004], [True, False, True]),   # 0.001 <= 0.01/3, 0.004 <= 0.01/2
    ([0.004, 0.006], [True, True]),               # 0.004 <= 0.005, 0.006 <= 0.01
    ([0.006, 0.006], [False, False]),             # 0.006 > 0.005: Holm stops
    ([], []),
])
def test_holm(pvals, want):
    assert D.holm(pvals, 0.01) == want


def test_gof_masked_token_is_a_violation_without_statistics():
    r = D.gof({1: 10, 2: 3}, {1: 13.0})
    assert r["p"] == 0.0 and r["masked"] == {"2": 3}


def test_gof_pools_small_categories():
    r = D.gof({1: 50, 2: 48, 3: 1, 4: 1}, {1: 50.0, 2: 48.0, 3: 1.0, 4: 1.0})
    assert r["categories"] == 3 and r["p"] > 0.9  # 1, 2, other


def test_predictor_applies_the_contracts_and_temperature():
    raw = np.zeros(contracts_vocab := 16)
    raw[3], raw[5] = 2.0, 1.0
    p = contracts.Params(temperature=0.5, allowed_token_ids=(3, 5, 7))
    row = D.Predictor(p, raw, [1, 2]).row([])
    want = np.exp(np.array([4.0, 2.0, 0.0]))
    assert np.allclose(row[[3, 5, 7]], want / want.sum()) and row.sum() == pytest.approx(1)
    assert row[[0, 1, 2, 4, 6]].sum() == 0
    # penalties: history-dependent, from the prefix (presence: every seen token -0.5 / T)
    pp = contracts.Params(temperature=1.0, presence_penalty=0.5)
    pr = D.Predictor(pp, np.zeros(contracts_vocab), [0])
    a, b = pr.row([]), pr.row([4])
    assert a[4] == pytest.approx(a[5]) and b[4] / b[5] == pytest.approx(np.exp(-0.5))


def test_power_and_false_alarm_on_synthetic_samples():
    """The tests' behaviour at the batch's sample size (256, 4 positions) on draws from known
    distributions: a healthy sampler is rarely flagged, a temperature applied twice (T 0.8 ->
    0.64 on the known model's row) nearly always."""
    rng = np.random.default_rng(0)
    raw = np.zeros(D.VOCAB)  # the known model's row: 8 hot tokens, the rest 0
    for t, v in D.TARGET_LOGITS.items():
        raw[t] = v
    p = contracts.Params(temperature=0.8)
    pred = D.Predictor(p, raw, D.PROMPT)
    good, bad = pred.row([]), D.softmax(raw / 0.64)
    flagged_good = flagged_bad = 0
    for _ in range(40):
        seqs = lambda q, k: [list(map(int, rng.choice(len(q), size=k, p=q))) for _ in range(256)]
        outs, ref = seqs(good, 4), seqs(good, 4)
        sharp = [o[:1] + s for o, s in zip(outs, seqs(bad, 3))]
        flagged_good += D.judge_cell(outs, pred, ref)["verdict"] == "violated"
        flagged_bad += D.judge_cell(sharp, pred, ref)["verdict"] == "violated"
    assert flagged_good <= 2 and flagged_bad >= 36


def test_two_sample_same_and_shifted():
    rng = np.random.default_rng(1)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.5, 0.25, 0.15, 0.1])
    a = D.counts(_draw(p, 3000, rng), 0)
    b = D.counts(_draw(p, 3000, rng), 0)
    c = D.counts(_draw(q, 3000, rng), 0)
    assert D.two_sample(a, b)["p"] > 0.001 and D.two_sample(a, c)["p"] < 1e-6


@pytest.mark.parametrize("kw,msg", [
    ({"methods": "none,eagle9"}, "method 'eagle9' is unknown"),
    ({"cases": "nope"}, "case 'nope' is unknown"),
    ({"faults": "nope"}, "fault 'nope' is unknown"),
    ({"temperature": 0}, "0 < temperature <= 2"),
    ({"temperature": 1.0, "faults": "rejection-tempered-twice"}, "skips the temperature"),
    ({"samples": 3}, "samples=3"),
])
def test_bad_input_is_one_line(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        D.plan(**kw)


def test_command_bad_input_rc2(capsys, tmp_path):
    assert D.main(["--out", str(tmp_path), "--methods", "bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: method 'bogus'") and "\n" not in err


@pytest.mark.parametrize("prefix, forced", [
    ((), None),                 # reasoning token 1: free
    ((100,), None),             # reasoning token 2: free
    ((100, 101), 2),            # the budget binds: the end marker, p = 1
    ((100, 2), None),           # the model ended the reasoning itself: nothing is due
    ((100, 101, 2), None),      # after the forced end: free again
])
def test_predictor_forces_the_end_marker_where_the_budget_binds(prefix, forced):
    from workbook.core import budget

    raw = np.zeros(400)
    raw[100], raw[101] = 2.0, 1.0
    m = budget.Markers(start=(1,), end=(2,))
    prompt = D.prompt_of("thinking_token_budget", m)
    assert prompt[-1] == 1
    pred = D.Predictor(contracts.Params(thinking_token_budget=2, temperature=0.8, max_tokens=4),
                       raw, prompt, m)
    row = pred.row(prefix)
    assert row.sum() == pytest.approx(1.0)
    if forced is None:
        assert row[100] > row[101] > row[2] > 0
    else:
        assert row[forced] == 1.0 and row.max() == 1.0
    # an observed token other than the forced one is a violation by itself
    if forced is not None:
        got = D.gof({100: 3, 2: 7}, {2: 10.0})
        assert got["p"] == 0.0 and got["masked"] == {"100": 3}


def test_budget_case_needs_the_engines_markers():
    from workbook.core import budget

    with pytest.raises(ConfigError, match="reasoning markers"):
        D.prompt_of("thinking_token_budget", budget.Markers())
    assert D.prompt_of("unconstrained") == D.PROMPT


def test_bad_words_are_sent_as_text_and_judged_as_vllms_token_ids():
    kw = D.sampling_kwargs("bad_words", lambda ids: "".join(f"<{i}>" for i in ids))
    assert kw == {"bad_words": [f"<{D.HOT[0]}>"]}
    with pytest.raises(ConfigError, match="tokenizer"):
        D.sampling_kwargs("bad_words")


def test_hot_tokens_are_each_their_own_texts_only_token():
    """A bad word reaches vLLM as text: each hot token must come back from its text alone
    (a byte-fragment id decodes to U+FFFD, whose tokens are others: the case would ban
    nothing — the first GPU run's bad_words cells equalled the unconstrained ones)."""
    from transformers import PreTrainedTokenizerFast

    from workbook.core import models

    tok = PreTrainedTokenizerFast(tokenizer_file=f"{models.build('tiny-mimo-mtp')}/tokenizer.json")
    for t in D.HOT:
        assert tok.encode(tok.decode([t]), add_special_tokens=False) == [t], t


def test_spec_counters_of_a_cell_are_the_difference():
    before = {"drafts": 10, "accepted": 4, "accepted_per_pos": [3, 1, 0]}
    after = {"drafts": 25, "accepted": 9, "accepted_per_pos": [6, 2, 1]}
    assert D.counters_delta(before, after) == {"drafts": 15, "accepted": 5,
                                               "accepted_per_pos": [3, 1, 1]}
    assert D.counters_delta({}, after) == after
