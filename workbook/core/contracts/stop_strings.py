"""The stop-strings contract (vLLM's ``stop``: text, matched on the host; no logits column,
the row check gathers nothing for it): once a stop string completes — one token at a time, as
without speculation, ``stop_string_end`` over the decoded prefixes the caller gives — the
returned tokens end at the token that completed it, nothing past it even when later tokens were
accepted drafts of the same step, the text ends right before it (or after it with
``include_stop_str_in_output``) and the request finished by "stop".

``unjudged`` says when it could not be checked: no stop string completes in the output's text
(the stop was never exercised).

Deliberately not here: decoding (the caller's tokenizer gives ``stop_string_end`` its prefixes,
with the request's ``skip_special_tokens``), stop token ids (``stopping``).
"""

from __future__ import annotations

from typing import Sequence

from workbook.core.contracts.base import Breach, Contract, ContractError, Params


def stop_string_end(p: Params, texts: Sequence[str]) -> tuple[int, str, int] | None:
    """Where a stop string first completes, one token at a time as without speculation:
    ``(i, s, start)`` — output index ``i`` of the token that completes stop string ``s``,
    which starts at character ``start`` of ``texts[i]`` — or None (no stop string completes).

    ``texts[i]``: the text of ``output[:i + 1]`` as the request decodes it (the caller's
    tokenizer, the request's ``skip_special_tokens``). vLLM's order (``check_stop_strings``):
    an occurrence must end in the text of a token at output index ``>= min_tokens``; of the
    strings completed by the same token the one ending first wins, then the list's order. A
    prefix whose text ends in U+FFFD (an incomplete UTF-8 character, which vLLM holds back)
    is skipped."""
    if not p.stop_strings:
        return None
    prev = len(texts[p.min_tokens - 1]) if 0 < p.min_tokens <= len(texts) else 0
    for i, t in enumerate(texts):
        if i < p.min_tokens or t.endswith("\ufffd"):
            continue
        best = None
        for s in p.stop_strings:
            j = t.find(s, max(0, prev - len(s) + 1))
            if j >= 0 and (best is None or j + len(s) < best[2] + len(best[1])):
                best = (i, s, j)
        if best is not None:
            return best
        prev = len(t)
    return None


def check_stop_strings(p: Params, output: Sequence[int], text: str | None,
                       texts: Sequence[str], finish_reason: str | None = None) -> list[Breach]:
    """The stop-string contract on what the user got: once a stop string completes (at output
    index ``i``, ``stop_string_end``), the request ends there — the returned tokens are
    ``output[:i + 1]`` (nothing past the token that completed it, also when later tokens were
    accepted drafts of the same step), the text ends right before the stop string
    (``include_stop_str_in_output``: right after it) and the finish reason is "stop".
    ``texts``: the decoded prefixes of the returned tokens (``stop_string_end``)."""
    hit = stop_string_end(p, texts)
    if hit is None:
        return []
    i, s, start = hit
    out: list[Breach] = []
    extra = len(output) - (i + 1)
    if extra > 0:
        out.append(Breach("stop_strings", f"stop string {s!r} completes at output index {i}, "
                          f"then {extra} more token(s) returned", int(output[i + 1]), i + 1))
    want = texts[i][:start + (len(s) if p.include_stop_str_in_output else 0)]
    if text is not None and text != want:
        side = "after" if p.include_stop_str_in_output else "before"
        out.append(Breach("stop_strings", f"returned text {text[-40:]!r} (length {len(text)}), "
                          f"expected it to end {side} stop string {s!r}: {want[-40:]!r} "
                          f"(length {len(want)})", None, i))
    if finish_reason is not None and finish_reason != "stop":
        out.append(Breach("stop_strings", f"stop string {s!r} completed at output index {i} but"
                          f" the request finished by {finish_reason}", None, i))
    return out


class StopStrings(Contract):
    """``stop``: the output ends at the token completing a stop string."""

    name = "stop_strings"
    rank = 110
    host_evidence = True
    reads = ("stop_strings", "include_stop_str_in_output", "min_tokens")
    stages = ("host-side post-processing",)

    def active(self, p):
        return bool(p.stop_strings)

    def check_output(self, p, o):
        if o.texts is None:
            return []
        return check_stop_strings(p, o.output, o.text, o.texts, o.finish_reason)

    def unjudged(self, p, o):
        if o.texts is not None and stop_string_end(p, o.texts) is None:
            return "no stop string completes in the output's text, so the stop was never " \
                   "exercised"
        return None

    def validate(self, p, vocab_size, max_logprobs):
        if any(not isinstance(x, str) or not x for x in p.stop_strings):
            raise ContractError("stop", "cannot contain an empty string")

    def case(self, baseline, decode):
        # the text of the baseline's first three tokens: it completes at output index 2,
        # inside step 1's accepted drafts (step 0, the prefill, emits index 0)
        return {"stop": [decode([int(t) for t in baseline[:3]]) or "!"],
                "include_stop_str_in_output": False}
