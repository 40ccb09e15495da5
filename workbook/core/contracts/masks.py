"""The contracts of vLLM's bias and bad-words states: ``allowed_token_ids`` (step 1: every
other column -> -inf), ``logit_bias`` (step 2: column c -> raw + b[c]), ``min_tokens`` (step 3:
the stop and EOS columns -> -inf while the row's output index < min_tokens; no stop/EOS before
it in the output — except with structured output where nothing else is left, below) and ``bad_words`` (step 5: the last token of a banned sequence whose prefix
ends the output as the row sees it -> -inf; no banned sequence inside the output).

What each promises is read from vLLM's ``SamplingParams`` documentation: the setting's meaning
for the user (an allowed set, an additive bias, a minimum length, banned sequences). Where two
promises meet, vLLM's own tests say which wins: with structured output (the grammar's promise),
a row whose only legal tokens are the request's stop/EOS columns keeps them — ``min_tokens``
does not leave it all ``-inf`` (vLLM 0.34.0 ``tests/v1/worker/test_gpu_logit_bias.py``
``test_v2_min_tokens_restores_stop_token_when_row_would_be_empty``, "Structured output plus
min_tokens must not leave an all -inf row", and its CPU twin; the same kernel in 0.32.0); without
structured output, or with another legal token left, min_tokens masks as before. The output
side follows: a structured request whose grammar ended at a stop token may stop before
``min_tokens`` (``GrammarTruth``: terminated there). A row sees
its own step's earlier drafts (``RowContext.seen_output``): a draft row must be processed as the
row the same token would have had without speculation.

Deliberately not here: the penalties (``penalties``), the stop that ends a request
(``stopping``), how vLLM stores the parameters per slot (the row check's registration evidence).
"""

from __future__ import annotations

import math
from typing import Mapping

from workbook.core import budget
from workbook.core.contracts.base import (NEG_INF, ROW_ORDER, Breach, Contract, ContractError,
                                          Params, RowContext, case_tokens, ids_in_vocab)
from workbook.core.contracts.structured import GrammarTruth

SAMPLER_STAGES = ("registration", "gate", "apply", "apply on draft rows", "sampling",
                  "acceptance")


class AllowedTokenIds(Contract):
    """``allowed_token_ids``: only these ids may be sampled; every other column is -inf."""

    name = "allowed_token_ids"
    rank = 40
    step = 1
    reads = ("allowed_token_ids", "thinking_token_budget")
    stages = SAMPLER_STAGES

    def active(self, p):
        return p.allowed_token_ids is not None

    def columns(self, p, markers):
        return list(p.allowed_token_ids or ())

    def row(self, p, ctx, col, x):
        return (NEG_INF, True) if col not in p.allowed_token_ids else (x, False)

    def check_row(self, p, ctx, finite_count):
        if finite_count is None:
            return []
        limit = len(set(p.allowed_token_ids))
        if p.thinking_token_budget is not None:
            limit += 1  # the budget's forced column wins over the mask
        if finite_count > limit:
            return [Breach(self.name, f"{finite_count} finite columns, at most {limit} allowed",
                           None, ctx.out_index)]
        return []

    def check_output(self, p, o):
        allowed = set(p.allowed_token_ids)
        bad = [(i, int(t)) for i, t in enumerate(o.output) if int(t) not in allowed]
        if bad:
            return [Breach(self.name, f"token {bad[0][1]} at index {bad[0][0]} not allowed "
                                      f"({len(bad)} such)", bad[0][1], bad[0][0])]
        return []

    def validate(self, p, vocab_size, max_logprobs):
        if p.allowed_token_ids is not None:
            if not p.allowed_token_ids:
                raise ContractError(self.name, "is not None and empty")
            ids_in_vocab(self.name, p.allowed_token_ids, vocab_size)

    def case(self, baseline, decode):
        return {"allowed_token_ids": case_tokens(baseline)[2]}


class LogitBias(Contract):
    """``logit_bias``: ``b[c]`` is added to column c's logit."""

    name = "logit_bias"
    rank = 30
    step = 2
    reads = ("logit_bias",)
    stages = SAMPLER_STAGES

    def active(self, p):
        return bool(p.logit_bias)

    def columns(self, p, markers):
        return [k for k, _ in p.logit_bias]

    def row(self, p, ctx, col, x):
        bias = dict(p.logit_bias)
        return (x + bias[col], True) if col in bias else (x, False)

    def validate(self, p, vocab_size, max_logprobs):
        ids_in_vocab(self.name, [k for k, _ in p.logit_bias], vocab_size)

    def case(self, baseline, decode):
        b0, _, other = case_tokens(baseline)
        return {"logit_bias": {b0: -50.0, other[0]: 5.0}}


class MinTokens(Contract):
    """``min_tokens``: no stop or EOS token (EOS even with ``ignore_eos``) before output index
    ``min_tokens``; a request finished by stop has at least that many tokens."""

    name = "min_tokens"
    rank = 20
    step = 3
    reads = ("min_tokens", "max_tokens", "stop_token_ids", "eos_token_ids")
    stages = SAMPLER_STAGES

    def active(self, p):
        return p.min_tokens > 0

    def columns(self, p, markers):
        return sorted(p.masked_by_min_tokens)

    def row(self, p, ctx, col, x):
        if ctx.out_index < p.min_tokens and col in p.masked_by_min_tokens:
            if p.json_schema is not None and ctx.stop_only:
                return x, False  # the grammar's end is all that is left: kept
            return NEG_INF, True
        return x, False

    def check_output(self, p, o):
        out = []
        g = GrammarTruth.of(o.grammar) if p.json_schema is not None else None
        ended = g.end if g is not None and g.terminated and g.end is not None else None
        for i, t in enumerate(o.output):
            if i == ended:
                break  # the grammar ended here: its stop was the only legal token
            if i < p.min_tokens and int(t) in p.masked_by_min_tokens:
                out.append(Breach(self.name, f"stop/EOS token {t} at output index {i} < "
                                             f"min_tokens={p.min_tokens}", int(t), i))
                break
        if o.finish_reason == "stop" and len(o.output) < p.min_tokens and ended is None:
            out.append(Breach(self.name, f"finished by stop after {len(o.output)} < min_tokens="
                                         f"{p.min_tokens} tokens", None, len(o.output)))
        return out

    def validate(self, p, vocab_size, max_logprobs):
        if p.min_tokens < 0:
            raise ContractError(self.name, f"must be >= 0, got {p.min_tokens}")
        if p.max_tokens is not None and p.max_tokens >= 1 and p.min_tokens > p.max_tokens:
            raise ContractError(self.name, f"must be <= max_tokens={p.max_tokens}, "
                                           f"got {p.min_tokens}")

    def case(self, baseline, decode):
        return {"min_tokens": 5, "stop_token_ids": [case_tokens(baseline)[0]]}


class BadWords(Contract):
    """``bad_words``: no banned sequence appears in the output; its last token is -inf at a
    row whose output (with the row's earlier drafts) ends in the sequence's prefix (vLLM
    matches within the output only, not the prompt)."""

    name = "bad_words"
    rank = 50
    step = 5
    reads = ("bad_words",)
    stages = ("registration", "gate", "device state", "apply", "apply on draft rows",
              "sampling", "acceptance")

    def active(self, p):
        return bool(p.bad_words)

    def columns(self, p, markers):
        return [w[-1] for w in p.bad_words if w]

    def row(self, p, ctx, col, x):
        seen = ctx.seen_output
        for w in p.bad_words:
            pre = list(w[:-1])
            if col == w[-1] and len(pre) <= len(seen) and \
                    (not pre or seen[len(seen) - len(pre):] == pre):
                return NEG_INF, True
        return x, False

    def check_output(self, p, o):
        output = [int(t) for t in o.output]
        out = []
        for w in p.bad_words:
            i = budget.first_index_of(output, w)
            if i >= 0:
                out.append(Breach(self.name, f"banned sequence {list(w)} at index {i}", w[-1],
                                  i + len(w) - 1))
        return out

    def validate(self, p, vocab_size, max_logprobs):
        if any(len(w) == 0 for w in p.bad_words):
            raise ContractError(self.name, "an entry tokenizes to no token")
        ids_in_vocab(self.name, [t for w in p.bad_words for t in w], vocab_size)

    def case(self, baseline, decode):
        b0, b1, _ = case_tokens(baseline)
        return {"bad_words": [decode([b0])] + ([decode([b1, b0])] if b1 != b0 else [])}



def stop_only(p: Params, ctx: RowContext, raw: Mapping[int, float], k: int | None = None) -> bool:
    """Whether a row, as ``min_tokens`` receives it, is finite at none but the request's stop
    and EOS columns (``RowContext.stop_only``): ``raw`` (column -> value of the row before
    ``apply_sampling_params``, the grammar bitmask already applied) through allowed_token_ids
    and logit_bias (steps 1-2, ``expected`` of the contracts before min_tokens). ``k``: ``raw``
    holds only some columns, among them the row's ``k`` largest (the row check's raw top-K;
    None: ``raw`` is the whole row) — then the answer is sure only where the allowed set is
    kept whole or fewer than ``k`` stop/EOS columns exist (else False: min_tokens masks)."""
    masked = p.masked_by_min_tokens
    if not masked or p.json_schema is None:
        return False
    if k is not None and p.allowed_token_ids is None and len(masked) >= k:
        return False
    early = [c for c in ROW_ORDER if c.step is not None and c.step < MinTokens.step
             and c.active(p)]
    for col, x in raw.items():
        if col in masked:
            continue
        x = float(x)
        for c in early:
            x = c.row(p, ctx, col, x)[0]
        if not math.isinf(x) or x > 0:
            return False
    return True
