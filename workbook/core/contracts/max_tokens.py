"""The max_tokens contract (vLLM's documented meaning: the maximum number of tokens generated
per output sequence; finish reason "length" when that limit ended it): the request returns at
most ``max_tokens`` tokens — nothing past the cap, also when the cap falls inside a step's
accepted drafts (the scheduler must cut the step's tokens there) — at most that many logprob
entries, and an output that reached the cap without a stop token finished by "length", not
"stop".

The contract changes no logits row (no ``step``): its stage is the host's post-processing of a
step's accepted tokens. ``unjudged``: an output shorter than the cap never exercised it.

Deliberately not here: the model's context limit (``max_model_len`` also ends a request by
"length", with fewer tokens: not judged here), stop tokens and stop strings (``stopping``,
``stop_strings``), the logprob values (``logprobs``).
"""

from __future__ import annotations

from workbook.core.contracts.base import Breach, Contract, ContractError


class MaxTokens(Contract):
    """``max_tokens``: at most that many tokens (and logprob entries); "length" at the cap."""

    name = "max_tokens"
    rank = 75
    reads = ("max_tokens", "stop_token_ids", "eos_token_ids", "ignore_eos", "stop_strings",
             "json_schema", "logprobs")
    stages = ("host-side post-processing",)

    def active(self, p):
        return p.max_tokens is not None

    def check_output(self, p, o):
        output, cap = [int(t) for t in o.output], p.max_tokens
        if len(output) > cap:
            return [Breach(self.name, f"{len(output)} tokens returned, max_tokens={cap}: "
                                      f"{len(output) - cap} past the cap, from output index "
                                      f"{cap}", output[cap], cap)]
        out = []
        if p.logprobs is not None and o.logprobs is not None and len(o.logprobs) > cap:
            out.append(Breach(self.name, f"{len(o.logprobs)} logprob entries returned, "
                                         f"max_tokens={cap}", None, cap))
        # at the cap, only a stop (a stop or EOS token, a stop string, the grammar's end) is
        # "stop"
        explained = (output and output[-1] in p.masked_by_min_tokens) or p.stop_strings or \
            p.json_schema is not None
        if len(output) == cap and o.finish_reason == "stop" and not explained:
            out.append(Breach(self.name, f"the output reached max_tokens={cap} with token "
                                         f"{output[-1]}, no stop token, yet finished by stop "
                                         f"instead of length", output[-1], cap - 1))
        return out

    def unjudged(self, p, o):
        n = len(o.output)
        if n < p.max_tokens:
            return (f"the output has {n} tokens, fewer than max_tokens={p.max_tokens}, so the "
                    f"cap was never exercised")
        return None

    def validate(self, p, vocab_size, max_logprobs):
        if p.max_tokens is not None and p.max_tokens < 1:
            raise ContractError(self.name, f"must be at least 1, got {p.max_tokens}")

    def case(self, baseline, decode):
        # lm_head zeroed, k=3: the prefill emits output index 0, step 1 indices 1-4 (three
        # accepted drafts and the bonus), step 2's target row index 5 — the cap — and its
        # accepted drafts 6-8 lie past it: the scheduler must cut inside the step
        return {"max_tokens": 6}
