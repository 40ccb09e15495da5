"""The thinking budget as a contract of the family (first in the catalogue): with
``thinking_token_budget`` set, vLLM ends the reasoning by forcing the end string where the
budget binds — ``reasoning_end_str``, token by token, in order, however many tokens the
reasoning configuration's start and end strings have (vLLM's documentation: "Once the reasoning
token count reaches the configured `thinking_token_budget`, vLLM forces the model to produce
`reasoning_end_str`, effectively terminating the reasoning block"; ``workbook.core.budget``),
continuing a prefix of it the reasoning text already holds rather than restarting it, so that
the string appears exactly once (vLLM's own tests: ``budget.begun``); the row forcing it holds
that column at or above ``budget.FORCED_LOGIT`` whatever the other contracts did to it (step 6
of the processing order, so temperature does not divide it), and the output holds the rest of
the end string from the index the budget makes it due.

Every piece of budget arithmetic is ``workbook.core.budget``'s (``row_truth`` for the row,
``judge`` for the output): this class only says which rows and columns the rule names and turns
its verdict into a ``Breach``. Only with complete reasoning markers (start and end known) is
anything judged.

Deliberately not here: the other side of the budget (a forced end where none was due:
``budget.forced_not_due``, judged by the trace's diagnosis, which sees the forcing); the
markers themselves (the engine's reasoning configuration).
"""

from __future__ import annotations

import functools

from workbook.core import budget
from workbook.core.contracts.base import (Breach, Contract, ContractError, Outcome, Params,
                                          RowContext)


class ThinkingBudget(Contract):
    """``thinking_token_budget``: at most that many reasoning tokens; the end marker is forced
    at the first output position whose reasoning count reaches the budget."""

    name = "thinking_token_budget"
    rank = 10
    step = 6
    forces = True
    reads = ("thinking_token_budget",)
    stages = ("registration", "gate", "device state", "apply", "apply on draft rows",
              "sampling", "acceptance")

    def active(self, p: Params) -> bool:
        return p.thinking_token_budget is not None

    def columns(self, p, markers):
        return list(budget.Markers.of(markers).end) if markers is not None else []

    def forced(self, p: Params, ctx: RowContext) -> int | None:
        if not ctx.markers.complete:
            return None
        return _forced(ctx, p.thinking_token_budget)

    def row(self, p: Params, ctx: RowContext, col: int, x: float) -> tuple[float, bool]:
        f = self.forced(p, ctx)
        return x, f is not None and col == f

    def check_output(self, p: Params, o: Outcome) -> list[Breach]:
        if o.markers is None or not budget.Markers.of(o.markers).complete:
            return []
        j = budget.judge(o.prompt, o.output, p.thinking_token_budget, o.markers)
        if j.honored is False:
            at = j.actual_end_index
            where = (f"first complete at {at}" if at is not None and at >= 0
                     else "never emitted whole")
            due = "due whole" if not j.begun else \
                f"due from its token {j.begun} (the text held {j.begun} of them)"
            return [Breach(self.name, f"end string {due} from {j.expected_end_index}, "
                                      f"{where}", None, j.expected_end_index)]
        return []

    def validate(self, p, vocab_size, max_logprobs):
        try:  # vLLM's meaning of the value, one place: budget.budget_param
            budget.budget_param(p.thinking_token_budget)
        except ValueError as e:
            raise ContractError(self.name, str(e)) from None

    def case(self, baseline, decode):
        return {"thinking_token_budget": 2}


@functools.lru_cache(maxsize=1024)
def _forced(ctx: RowContext, b) -> int | None:
    """The token the budget forces at this row (``budget.row_truth``), once per row and budget
    (``row`` asks per column)."""
    t = budget.row_truth(list(ctx.prompt) + list(ctx.output), list(ctx.drafts), ctx.local_pos, b,
                         ctx.markers, prompt_len=len(ctx.prompt))
    return int(t.token) if t.due else None
