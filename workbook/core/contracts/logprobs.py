"""The logprobs contract: with ``logprobs`` set, every returned token carries a logprob, and
each value is what the row that emitted the token says — its log-softmax, or its logit, of the
raw or the processed row per ``logprobs_mode`` (vLLM's documented meaning of the four modes).
An accepted draft's logprob comes from its own draft row, not a neighbour's.

The rows' side (``logprob_truth``: ``expected_logprob`` over the row evidence's logsumexp and
values) is built by the caller; here the returned values are compared with it to
``RTOL``/``ATOL`` and the entry count with the output's length.

Deliberately not here: the top-k alternatives' ids (a near tie may order them differently),
prompt logprobs (``prompt_logprobs``), gathering the rows (``workbook.hooks.observe.rowcheck``).
"""

from __future__ import annotations

from workbook.core.contracts.base import (LOGPROBS_MODES, Breach, Contract, ContractError,
                                          close)


def expected_logprob(mode: str, value: float, lse: float) -> float:
    """What vLLM returns for a column holding ``value`` in a row whose logsumexp is ``lse``
    (``value``/``lse`` of the raw row for raw_* modes, of the processed row otherwise)."""
    return value if mode.endswith("_logits") else value - lse


def check_count(name: str, n: int, max_logprobs: int, vocab_size: int, raw) -> None:
    """vLLM's bound on a logprobs count (``-1``: the whole vocabulary)."""
    n = vocab_size if raw == -1 else n
    if n < 0:
        raise ContractError(name, f"must be non-negative or -1, got {raw}")
    if n > max_logprobs:
        raise ContractError(name, f"{n} is greater than max allowed: {max_logprobs}")


class Logprobs(Contract):
    """``logprobs``: one entry per returned token, each its own row's value."""

    name = "logprobs"
    rank = 80
    reads = ("logprobs", "logprobs_mode")
    stages = ("logprob row selection",)

    def active(self, p):
        return p.logprobs is not None

    def check_output(self, p, o):
        if o.logprobs is None:
            return []
        output, out = list(o.output), []
        if len(o.logprobs) != len(output):
            out.append(Breach(self.name, f"{len(o.logprobs)} logprob entries for {len(output)} "
                                         f"tokens", None, min(len(o.logprobs), len(output))))
        for i, (got, want) in enumerate(zip(o.logprobs, o.logprob_truth or [])):
            if got is None or want is None:
                continue
            if not close(float(got), float(want)):
                out.append(Breach(self.name, f"token {output[i]} at index {i}: returned "
                                             f"{float(got):.6g}, its row says {float(want):.6g}",
                                  output[i], i))
                break
        return out

    def validate(self, p, vocab_size, max_logprobs):
        if p.logprobs is not None:
            check_count(self.name, p.logprobs, max_logprobs, vocab_size, p.logprobs)
        if p.logprobs_mode not in LOGPROBS_MODES:
            raise ContractError("logprobs_mode", f"must be one of {LOGPROBS_MODES}, "
                                                 f"got {p.logprobs_mode!r}")

    def case(self, baseline, decode):
        return {"logprobs": 3}
