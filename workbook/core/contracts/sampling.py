"""The sampling settings that are row steps but not constraints of their own: ``temperature``
(step 7, last: a finite processed value is divided by T when T is neither 0, greedy, nor 1; a
column the budget forces is not divided) and the rank filters ``min_p`` / ``top_k`` /
``top_p``, which the family refuses (a row's surviving set is a rank property of the whole row,
not a property of the columns a contract names, so no column rule could judge it).

Neither is listed in ``CONSTRAINTS`` (no grid case, never a request's own constraint); a
breach at a column temperature divided is owned by the contract that changed the column.

Deliberately not here: the random draw of sampling (the row check judges the processed row and,
greedy, its argmax), anything vLLM does after the processed row.
"""

from __future__ import annotations

import math

from workbook.core.contracts.base import Contract, ContractError


class Temperature(Contract):
    """``temperature``: the processed row is the logits divided by T (0: greedy, undivided)."""

    name = "temperature"
    rank = 900
    step = 7
    listed = False
    reads = ("temperature",)
    stages = ("gate", "apply", "apply on draft rows")  # behind the sampler's per-request gate

    def active(self, p):
        return p.temperature not in (0.0, 1.0)

    def row(self, p, ctx, col, x):
        return (x / p.temperature if math.isfinite(x) else x), False

    def validate(self, p, vocab_size, max_logprobs):
        if not math.isfinite(p.temperature) or not 0.0 <= p.temperature <= 2.0:
            raise ContractError("temperature", f"must be in [0, 2], got {p.temperature}")


class RankFilters(Contract):
    """``min_p``, ``top_k``, ``top_p``: refused (not judged by any contract)."""

    name = "rank_filters"
    rank = 910
    listed = False
    reads = ("min_p", "top_k", "top_p")

    def validate(self, p, vocab_size, max_logprobs):
        if p.min_p != 0.0:
            raise ContractError("min_p", "not judged by the contracts (a rank property of the "
                                         "row); leave it 0")
        if p.top_k not in (0, -1) or p.top_p != 1.0:
            raise ContractError("top_k" if p.top_k not in (0, -1) else "top_p",
                                "not judged by the contracts (a rank property of the row); "
                                "leave top_k 0 and top_p 1")
