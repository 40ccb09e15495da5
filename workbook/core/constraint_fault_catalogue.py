"""The constraint fault catalogue: each fault's name, what it breaks, and the contract and
MRV2 stage the evidence must name when it is injected (the implementations, which patch vLLM,
are ``workbook.hooks.faults.constraints``; what each does there is in its docstring).

Here, not in the hooks, so a run's ``constraint_fault`` is validated (``workbook.core.config``)
without importing vLLM. A new fault: one entry in each dictionary here + its ``inject`` branch.
Deliberately not here: any patching, any vLLM import.
"""

from __future__ import annotations

FAULTS = {
    "bias-target-row-only": "allowed_token_ids / logit_bias / min_tokens applied to target rows "
                            "only",
    "penalties-target-row-only": "penalties applied to target rows only",
    "bad-words-target-row-only": "bad words applied to target rows only",
    "penalties-drafts-uncounted": "penalties ignore a row's earlier drafts",
    "min-tokens-off-by-one": "min_tokens reads position + 1",
    "gate-off": "the per-slot gate is off: the fast path skips all processing",
    "stop-not-trimmed": "the scheduler keeps tokens after a stop token within a step",
    "logprobs-row-shift": "returned logprobs come from the next logits row",
    "budget-draft-rows": "the budget kernel never forces draft rows (H-d-draft)",
    "grammar-skipped-once": "the grammar bitmask is not applied in the first step that "
                            "constrains a row",
    "prompt-logprobs-row-shift": "prompt logprobs come from the next row's hidden state",
    "stop-string-not-trimmed": "tokens after a stop string's within a step are kept (as in "
                               "vLLM 0.28-0.31)",
    "max-tokens-step-end": "the length cap is checked at a step's last token only",
    "penalties-next-column": "the presence penalty also lands one column past each row's "
                             "input token",
    "allowed-mask-every-row": "one request's allowed_token_ids mask is applied to every row "
                              "of the batch",
    # distribution faults (temperature > 0 only; greedy output unchanged): the distribution
    # oracle's (workbook.run.constraints.distribution)
    "rejection-tempered-twice": "the rejection sampler divides the processed (already "
                                "tempered) target rows by the temperature again",
    "draft-rows-untempered": "the temperature is not applied to draft rows (local position "
                             ">= 1) of the rejection sampler",
}
# the contract each fault breaks and the stage the evidence must name
EXPECTED = {
    "bias-target-row-only": ("allowed_token_ids", "apply on draft rows"),
    "penalties-target-row-only": ("penalties", "apply on draft rows"),
    "bad-words-target-row-only": ("bad_words", "apply on draft rows"),
    "penalties-drafts-uncounted": ("penalties", "apply on draft rows"),
    "min-tokens-off-by-one": ("min_tokens", ("apply", "apply on draft rows")),
    "gate-off": ("penalties", "gate"),
    "stop-not-trimmed": ("stop", "host-side post-processing"),
    "logprobs-row-shift": ("logprobs", "logprob row selection"),
    "budget-draft-rows": ("thinking_token_budget", "apply on draft rows"),
    "grammar-skipped-once": ("structured_output", "grammar bitmask"),
    "prompt-logprobs-row-shift": ("prompt_logprobs", "prompt row selection"),
    "stop-string-not-trimmed": ("stop_strings", "host-side post-processing"),
    "max-tokens-step-end": ("max_tokens", "host-side post-processing"),
    "penalties-next-column": ("penalties", "apply"),
    # the source request's contract, on a neighbour's rows (``workbook.run.constraints.rowjudge``)
    "allowed-mask-every-row": ("allowed_token_ids", ("apply", "apply on draft rows")),
    "rejection-tempered-twice": ("temperature", "rejection"),
    "draft-rows-untempered": ("temperature", "apply on draft rows"),
}
# faults only a distribution test sees (no effect at temperature 0)
DISTRIBUTION_FAULTS = ("rejection-tempered-twice", "draft-rows-untempered")
