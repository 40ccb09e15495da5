"""The penalties contract (step 4 of the processing order): ``repetition_penalty``,
``presence_penalty`` and ``frequency_penalty`` on a column, as vLLM documents them — repetition
divides a positive logit by r and multiplies a negative one by r when the token appears in the
prompt or in the output so far; frequency subtracts ``frequency * n`` and presence subtracts
``presence`` once, where ``n`` counts the token in the output so far.

"The output so far" of a draft row includes the step's earlier drafts (``seen_output``): a
draft row is penalised exactly as the row the same history would have without speculation. The
columns are the history's and the drafts' (gathered by the evidence on the device), so the
contract names no static column.

Deliberately not here: vLLM's penalty count tensors (the row check's commit evidence), the
order in which vLLM's kernel applies the three (it is the order above for any values).
"""

from __future__ import annotations

import math

from workbook.core.contracts.base import Contract, ContractError, Params


def penalised(p: Params, x: float, count: int, in_prompt: bool) -> float:
    """vLLM's penalties on one column (step 4 of the order)."""
    if p.repetition_penalty != 1.0 and (in_prompt or count > 0):
        r = p.repetition_penalty
        x = x / r if x > 0 else x * r
    return x - p.frequency_penalty * count - p.presence_penalty * (1 if count > 0 else 0)


class Penalties(Contract):
    """Repetition, presence and frequency penalties over the prompt and the output so far."""

    name = "penalties"
    rank = 60
    step = 4
    reads = ("repetition_penalty", "presence_penalty", "frequency_penalty")
    stages = ("registration", "gate", "device state", "apply", "apply on draft rows",
              "sampling", "acceptance")

    def active(self, p):
        return p.penalised

    def row(self, p, ctx, col, x):
        n = ctx.seen_output.count(col)
        in_prompt = col in ctx.prompt
        changed = (p.repetition_penalty != 1.0 and (n > 0 or in_prompt)) or \
            (n > 0 and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0))
        return penalised(p, x, n, in_prompt), changed

    def validate(self, p, vocab_size, max_logprobs):
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(p, name)
            if not -2.0 <= v <= 2.0:
                raise ContractError(name, f"must be in [-2, 2], got {v}")
        if not math.isfinite(p.repetition_penalty) or p.repetition_penalty <= 0.0:
            raise ContractError("repetition_penalty", f"must be a finite number > 0, "
                                                      f"got {p.repetition_penalty}")

    def case(self, baseline, decode):
        # negative presence / frequency raise the columns already emitted: on the zeroed
        # lm_head the target's argmax stays the drafter's token, so drafts are accepted and
        # draft rows with earlier accepted drafts are checked (a positive one moves the
        # target's argmax off the drafter's token: no draft is ever accepted)
        return {"repetition_penalty": 1.5, "presence_penalty": -0.5, "frequency_penalty": -0.3}
