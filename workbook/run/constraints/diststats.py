"""The distribution oracle's statistics (no engine): per position, the observed token counts
against what the contracts predict (``Predictor``: softmax(processed row / T), a forced column
taking all the probability; ``gof``: Pearson's chi-square, a sampled masked token a violation by
itself) and against the reference method's counts (``two_sample``: a contingency table), Holm
over every test of one cell (``holm``, ``judge_cell``). Pure ``numpy`` / ``scipy.stats``.

Not here: the engine, the known model and the batch (``workbook.run.constraints.distribution``).
"""

from __future__ import annotations

import numpy as np

from workbook.core import contracts

ALPHA = 0.01  # family-wise error rate per cell (Holm over its positions and tests)
MIN_EXPECTED = 5.0  # categories expected below this are pooled (chi-square's validity rule)


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm–Bonferroni: which of ``pvalues`` are rejected at family-wise level ``alpha``."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    m = len(pvalues)
    for k, i in enumerate(order):
        if pvalues[i] > alpha / (m - k):
            break
        rejected[i] = True
    return rejected


def pooled(expected: dict, min_expected: float = MIN_EXPECTED) -> tuple[list, set]:
    """The categories kept on their own (expected >= ``min_expected``, largest first) and the
    set pooled into "other"."""
    keep = [c for c, e in sorted(expected.items(), key=lambda kv: -kv[1]) if e >= min_expected]
    return keep, set(expected) - set(keep)


def gof(observed: dict, expected: dict, min_expected: float = MIN_EXPECTED) -> dict:
    """Goodness of fit of the observed counts (category -> count) to the expected counts
    (category -> expected count, summing to the number of samples; a category missing from
    ``expected`` has expected count 0). An observed category with expected count 0 is
    ``masked``: a violation with p = 0. Else Pearson's chi-square over the kept categories +
    "other" (``scipy.stats.chisquare``, ddof 0)."""
    from scipy import stats

    n = sum(observed.values())
    masked = {c: k for c, k in observed.items() if k and expected.get(c, 0.0) <= 0.0}
    if masked:
        return {"p": 0.0, "masked": {str(c): int(k) for c, k in masked.items()}, "n": n,
                "categories": None, "statistic": None}
    keep, rest = pooled(expected, min_expected)
    obs = [observed.get(c, 0) for c in keep]
    exp = [expected[c] for c in keep]
    other_e = sum(expected[c] for c in rest)
    if other_e > 0:
        obs.append(n - sum(obs))
        exp.append(other_e)
    if len(obs) < 2:
        return {"p": 1.0, "masked": {}, "n": n, "categories": len(obs), "statistic": 0.0}
    exp = np.asarray(exp, float) * (n / sum(exp))  # float rounding of the predicted rows
    res = stats.chisquare(np.asarray(obs, float), exp)
    return {"p": float(res.pvalue), "masked": {}, "n": n, "categories": len(obs),
            "statistic": float(res.statistic)}


def two_sample(a: dict, b: dict, min_expected: float = MIN_EXPECTED) -> dict:
    """Whether counts ``a`` and ``b`` (category -> count) come from one distribution: a 2 × K
    contingency table (categories whose pooled expected count in either sample falls below
    ``min_expected`` pooled into "other"), ``scipy.stats.chi2_contingency``."""
    from scipy import stats

    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return {"p": 1.0, "n": [na, nb], "categories": 0, "statistic": None}
    tot = {c: a.get(c, 0) + b.get(c, 0) for c in set(a) | set(b)}
    frac = min(na, nb) / (na + nb)
    keep, rest = pooled({c: t * frac for c, t in tot.items()}, min_expected)
    rows = [[a.get(c, 0) for c in keep], [b.get(c, 0) for c in keep]]
    if rest:
        rows[0].append(sum(a.get(c, 0) for c in rest))
        rows[1].append(sum(b.get(c, 0) for c in rest))
    table = np.asarray(rows, float)
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return {"p": 1.0, "n": [na, nb], "categories": int(table.shape[1]), "statistic": 0.0}
    res = stats.chi2_contingency(table, correction=False)
    return {"p": float(res.pvalue), "n": [na, nb], "categories": int(table.shape[1]),
            "statistic": float(res.statistic)}


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, float)
    m = np.max(x[np.isfinite(x)]) if np.isfinite(x).any() else 0.0
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return e / e.sum()


class Predictor:
    """The predicted distribution of a position: softmax(processed row / T), the processed row
    being ``contracts.expected`` per column from the raw row ``raw`` (the known model's, read
    back from vLLM) and the sample's own prefix; a column a forcing contract (the budget)
    forces takes all the probability (p = 1). Columns no contract names and no history touches
    are computed once; the history's and the markers' columns per distinct prefix."""

    def __init__(self, p: contracts.Params, raw: np.ndarray, prompt: list[int], markers=None):
        from workbook.core import budget

        self.p, self.raw, self.prompt = p, np.asarray(raw, float), tuple(prompt)
        self.markers = markers if markers is not None else budget.Markers()
        ctx = self._ctx(())
        self.base = np.array([contracts.expected(p, ctx, c, float(x)).value
                              for c, x in enumerate(self.raw)])
        self.history_dependent = p.penalised or p.thinking_token_budget is not None
        self._cache: dict[tuple, np.ndarray] = {}

    def _ctx(self, output):
        return contracts.RowContext(self.prompt, tuple(output), markers=self.markers)

    def row(self, prefix) -> np.ndarray:
        """The predicted probabilities (over the vocabulary) of the token after ``prefix``."""
        key = tuple(prefix) if self.history_dependent else ()
        got = self._cache.get(key)
        if got is None:
            x = self.base.copy()
            if self.history_dependent:
                ctx = self._ctx(key)
                cols = set(self.prompt) | set(key) | set(self.markers.start) | \
                    set(self.markers.end) | set(self.markers.natural_end)
                for c in sorted(cols):
                    e = contracts.expected(self.p, ctx, c, float(self.raw[c]))
                    if e.forced:
                        got = np.zeros(len(self.raw))
                        got[c] = 1.0
                        break
                    x[c] = e.value
            if got is None:
                got = softmax(x)
            self._cache[key] = got
        return got


def expected_counts(pred: Predictor, outputs: list[list[int]], pos: int) -> dict:
    """sum over samples of the predicted distribution at ``pos`` (each after its own prefix),
    as token -> expected count (tokens with expected mass 0 left out)."""
    tot = np.zeros(len(pred.raw))
    for o in outputs:
        if len(o) > pos:
            tot += pred.row(o[:pos])
    return {int(c): float(tot[c]) for c in np.flatnonzero(tot > 0)}


def counts(outputs: list[list[int]], pos: int, pairs: bool = False) -> dict:
    out: dict = {}
    for o in outputs:
        if len(o) > pos and (not pairs or pos >= 1):
            k = (o[pos - 1], o[pos]) if pairs else o[pos]
            out[k] = out.get(k, 0) + 1
    return out


def judge_cell(outputs: list[list[int]], pred: Predictor | None,
               reference: list[list[int]] | None, alpha: float = ALPHA) -> dict:
    """Every test of one cell (``outputs``: the samples, one token list each): per position
    the contract test (``pred``; None: not judged against the contract) and, with
    ``reference`` (method none's samples of the same case), the two-sample tests of the token
    and of the adjacent pair; Holm over all of them at ``alpha``. Returns the tests, the
    rejected ones and the verdict ("holds" / "violated")."""
    positions = max((len(o) for o in outputs), default=0)
    tests = []
    for t in range(positions):
        if pred is not None:
            r = gof(counts(outputs, t), expected_counts(pred, outputs, t))
            tests.append({"position": t, "test": "contract", **r})
        if reference is not None:
            r = two_sample(counts(outputs, t), counts(reference, t))
            tests.append({"position": t, "test": "spec vs none", **r})
            if t >= 1:
                r = two_sample(counts(outputs, t, True), counts(reference, t, True))
                tests.append({"position": t, "test": "spec vs none (pairs)", **r})
    rejected = holm([x["p"] for x in tests], alpha)
    for x, rej in zip(tests, rejected):
        x["rejected"] = rej
    first = next((x for x in tests if x["rejected"]), None)
    return {"verdict": "violated" if first else "holds", "tests": tests, "first": first,
            "min_p": min((x["p"] for x in tests), default=1.0), "alpha": alpha}


def describe(first: dict | None) -> str:
    """One sentence for a cell's first rejected test."""
    if first is None:
        return "every test holds"
    where = f"position {first['position']}, {first['test']}"
    if first.get("masked"):
        toks = ", ".join(f"{c} ({k}x)" for c, k in first["masked"].items())
        return f"{where}: masked token(s) sampled: {toks}"
    return f"{where}: p = {first['p']:.3g} over {first['categories']} categories"
