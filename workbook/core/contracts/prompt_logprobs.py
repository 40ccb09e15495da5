"""The prompt-logprobs contract (host-side: no logits column of the output rows): every
prompt position holds the prompt's own token, each value is what the logits row that predicts
the position says (log-softmax, or logit per ``logprobs_mode``), and that row's input token is
the prompt's previous token (``check_prompt_logprobs``); the same request without speculation
returns the same values to ``RTOL``/``ATOL``, rank by rank, so a near tie's order is not a
difference (``prompt_logprobs_divergence``, the differential).

``unjudged`` says when it could not be checked: no prompt logprobs were returned.

Deliberately not here: gathering the prompt rows (``workbook.hooks.observe.rowcheck``'s prompt-logprob
evidence), the differential's reference run (``workbook.run``).
"""

from __future__ import annotations

from typing import Sequence

from workbook.core.contracts.base import Breach, Contract, close
from workbook.core.contracts.logprobs import check_count


def check_prompt_logprobs(prompt: Sequence[int], returned: Sequence[dict | None] | None,
                          truth: Sequence[dict | None] | None = None,
                          row_inputs: Sequence[int | None] | None = None
                          ) -> list[tuple[int | None, Breach]]:
    """The prompt-logprobs contract: ``returned[q]`` (``{token id: logprob}``, position ``q``
    of the prompt; ``q = 0`` has none) holds the prompt's own token ``prompt[q]`` and every
    value equals ``truth[q][id]`` — what the logits row that predicts position ``q`` says
    (the log-softmax, or the logit per ``logprobs_mode``, of the row whose input token is
    ``prompt[q - 1]``); ``row_inputs[q]``: that row's input token as the evidence saw it.
    Returns ``(position, breach)`` pairs, first breach per kind (position None: the list)."""
    out: list[tuple[int | None, Breach]] = []
    if returned is None:
        return out
    if len(returned) != len(prompt):
        out.append((None, Breach("prompt_logprobs", f"{len(returned)} prompt logprob entries "
                                 f"for a prompt of {len(prompt)} tokens")))
    seen: set[str] = set()

    def add(q, kind, b):
        if kind not in seen:
            seen.add(kind)
            out.append((q, b))

    for q in range(1, min(len(returned), len(prompt))):
        d = returned[q]
        if d is None:
            add(q, "missing", Breach("prompt_logprobs", f"position {q}: no entry", prompt[q]))
            continue
        if int(prompt[q]) not in d:
            add(q, "token", Breach("prompt_logprobs", f"position {q}: the prompt's token "
                                   f"{prompt[q]} is not among the returned ids {sorted(d)[:6]}",
                                   int(prompt[q])))
        if row_inputs is not None and q < len(row_inputs) and row_inputs[q] is not None \
                and int(row_inputs[q]) != int(prompt[q - 1]):
            add(q, "row", Breach("prompt_logprobs", f"position {q}: computed from a row whose "
                                 f"input token is {row_inputs[q]}, the prompt has "
                                 f"{prompt[q - 1]} there", int(prompt[q])))
        want = truth[q] if truth is not None and q < len(truth) else None
        if want:
            for t, v in d.items():
                w = want.get(int(t))
                if w is not None and not close(float(v), float(w)):
                    add(q, "value", Breach("prompt_logprobs", f"position {q}, token {t}: "
                                           f"returned {float(v):.6g}, its row says "
                                           f"{float(w):.6g}", int(t)))
                    break
    return out


def prompt_logprobs_divergence(got: Sequence[dict | None] | None,
                               ref: Sequence[dict | None] | None) -> dict | None:
    """The differential of prompt logprobs: None when ``got`` equals ``ref`` (the same
    request without speculation) to the tolerance, else the first position that differs and
    how. Per position the prompt token's logprob must agree, and the returned values sorted
    must agree rank by rank (the top-k ids of a near tie may be ordered differently; their
    values may not differ)."""
    if got is None or ref is None:
        return None if got is ref else {"position": None, "what": "prompt logprobs returned "
                                        "by one run only"}
    if len(got) != len(ref):
        return {"position": None, "what": f"{len(got)} positions vs {len(ref)} without "
                                          f"speculation"}
    for q, (a, b) in enumerate(zip(got, ref)):
        if not a and not b:
            continue
        if not a or not b:
            return {"position": q, "what": "an entry in one run only"}
        a = {int(k): float(v) for k, v in a.items()}
        b = {int(k): float(v) for k, v in b.items()}
        for t in set(a) & set(b):
            if not close(a[t], b[t]):
                return {"position": q, "token": t, "got": a[t], "reference": b[t],
                        "what": f"position {q}, token {t}: {a[t]:.6g} vs {b[t]:.6g} without "
                                f"speculation"}
        va, vb = sorted(a.values(), reverse=True), sorted(b.values(), reverse=True)
        if len(va) != len(vb) or not all(close(x, y) for x, y in zip(va, vb)):
            return {"position": q, "what": f"position {q}: values {[round(x, 6) for x in va]}"
                                           f" vs {[round(x, 6) for x in vb]} without "
                                           f"speculation"}
    return None


class PromptLogprobs(Contract):
    """``prompt_logprobs``: each prompt position's logprobs are its own row's."""

    name = "prompt_logprobs"
    rank = 100
    host_evidence = True
    reads = ("prompt_logprobs", "logprobs_mode")
    stages = ("prompt row selection", "host-side post-processing")

    def active(self, p):
        return p.prompt_logprobs is not None

    def check_output(self, p, o):
        if o.prompt_logprobs is None:
            return []
        return [b for _, b in check_prompt_logprobs(o.prompt, o.prompt_logprobs)]

    def unjudged(self, p, o):
        return "no prompt logprobs were returned" if o.prompt_logprobs is None else None

    def validate(self, p, vocab_size, max_logprobs):
        if p.prompt_logprobs is not None:
            check_count(self.name, p.prompt_logprobs, max_logprobs, vocab_size,
                        p.prompt_logprobs)

    def case(self, baseline, decode):
        return {"prompt_logprobs": 3, "logprobs": 3}
