"""The stop contract: a stop token (``stop_token_ids``, and EOS unless ``ignore_eos``) ends
the request — nothing follows it in the output, also when the tokens after it were accepted
drafts of the same step (vLLM's scheduler must trim them).

A stop token is a stop only from output index ``min_tokens`` on (before it, ``min_tokens``
masks it: that is ``min_tokens``'s contract, not this one). The contract changes no logits row:
its stage is the host's post-processing of a step's accepted tokens.

Deliberately not here: stop strings (text, matched on the host: ``stop_strings``), masking the
stop columns (``min_tokens``), the length cap (``max_tokens``).
"""

from __future__ import annotations

from workbook.core.contracts.base import Breach, Contract, case_tokens, ids_in_vocab


class Stop(Contract):
    """A stop token ends the request: nothing follows it."""

    name = "stop"
    rank = 70
    reads = ("stop_token_ids", "eos_token_ids", "ignore_eos", "min_tokens")
    stages = ("host-side post-processing",)

    def active(self, p):
        return bool(p.stop_token_ids) or (bool(p.eos_token_ids) and not p.ignore_eos)

    def check_output(self, p, o):
        output = [int(t) for t in o.output]
        out = []
        for i, t in enumerate(output[:-1]):
            if t in p.stopping_ids and i >= p.min_tokens:
                out.append(Breach(self.name, f"stop token {t} at index {i}, then "
                                             f"{len(output) - i - 1} more token(s)", t, i + 1))
                break
        return out

    def validate(self, p, vocab_size, max_logprobs):
        ids_in_vocab("stop_token_ids", p.stop_token_ids, vocab_size)

    def case(self, baseline, decode):
        # min_tokens 2 moves the stop token inside a step's accepted drafts (lm_head zeroed)
        return {"stop_token_ids": [case_tokens(baseline)[0]], "ignore_eos": False,
                "min_tokens": 2}
