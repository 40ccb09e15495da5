"""The differential: each spec cell against method ``none``'s same request at the same grid point
(the greedy output's first divergence, located to the spec run's step and row with its margin;
prompt logprobs rank by rank). Blind to a defect that does not depend on speculation (it is in
the reference too): the batch-invariance reference (``invariance``) is the one such a defect
cannot share. Not here: the cells (``cases``).
"""

from __future__ import annotations

from workbook.core import contracts


def evidence_key(batch: str, axes: dict | None) -> str:
    """The evidence file of a batch at a grid point: ``<batch>`` at the default point (no axes
    given), else ``<batch>@axis=value,...``."""
    return batch + ("@" + ",".join(f"{k}={v}" for k, v in axes.items()) if axes else "")


def differential(cells: list, evidence: dict, reference: list | None = None,
                 spec_only=()) -> None:
    """Fill each spec cell's ``differential`` against method ``none``'s same request at the
    same grid point (axes in ``spec_only`` — the drafter's — ignored: ``none`` has no
    drafter): the cells of ``reference`` (the healthy configuration's, when the grid injects
    a constraint fault), else the grid's own ``none`` cells."""
    point = lambda c: tuple(sorted((k, str(v)) for k, v in (c.axes or {}).items()
                                   if k not in spec_only))
    ref = {(c.constraint, c.batch, point(c)): c
           for c in (cells if reference is None else reference) if c.method == "none"}
    for c in cells:
        r = ref.get((c.constraint, c.batch, point(c)))
        if c.method == "none" or r is None or not c.output or not r.output:
            continue
        if c.samples or r.samples:  # sampled (the n axis): no greedy equality to compare
            c.differential = {"vs": "none", "unavailable": "sampled outputs (n > 1 at "
                              "temperature > 0): speculative decoding keeps the distribution, "
                              "not the draws"}
            continue
        if r.status == "error":  # the reference went unobserved: no differential claimed
            c.differential = {"vs": "none", "unavailable": f"the reference cell: {r.message}"}
            continue
        c.differential = None  # filled afresh (the grid refills it as methods finish)
        if c.prompt_logprobs is not None or r.prompt_logprobs is not None:
            _prompt_differential(c, r)
        i = contracts.first_divergence(c.output, r.output)
        if i is None:
            c.differential = {"vs": "none", "identical": True, "tokens": len(c.output),
                              **({"prompt_logprobs": c.differential["prompt_logprobs"]}
                                 if c.differential else {})}
            continue
        ev = evidence.get(c.method, {}).get(evidence_key(c.batch, c.axes), {}).get(
            c.constraint, {})
        at = emitted_at(ev, i)
        c.differential = {"vs": "none", "identical": False, "out_index": i,
                          "token": c.output[i] if i < len(c.output) else None,
                          "reference_token": r.output[i] if i < len(r.output) else None, **at,
                          **({"prompt_logprobs": c.differential["prompt_logprobs"]}
                             if c.differential else {})}


def _prompt_differential(c, r) -> None:
    """Prompt logprobs are the prompt's, whatever the method: a spec cell's must equal
    ``none``'s for the same request (``contracts.prompt_logprobs_divergence``); a difference
    is a violation of the cell's ``prompt_logprobs`` contract at stage ``differential vs
    none`` (the rows it came from are self-consistent: the hidden states differ)."""
    unpack = lambda pl: None if pl is None else [None if d is None else {int(t): float(v)
                                                 for t, v in d} for d in pl]
    d = contracts.prompt_logprobs_divergence(unpack(c.prompt_logprobs), unpack(r.prompt_logprobs))
    c.differential = {"prompt_logprobs": d or "identical"}
    if d is not None and c.constraint == "prompt_logprobs" and c.status in ("holds",
                                                                           "not judged"):
        c.status, c.breaches = "violated", c.breaches + 1
        c.first = {"step": None, "row": None, "local_pos": None, "stage": "differential vs none",
                   "contract": "prompt_logprobs", "what": d["what"], "column": d.get("token"),
                   "out_index": None, "position": d.get("position")}


def emitted_at(ev: dict, i: int) -> dict:
    """Where output index ``i`` was emitted in one request's row evidence: step, row, local
    position and that row's top-1/top-2 margin ({} when not recorded)."""
    n = 0
    for s in ev.get("steps", []):
        for row in s["rows"]:
            if row.get("emitted_token") is None:
                continue
            if n == i:
                return {"step": s["step"], "row": row["row"], "local_pos": row["local_pos"],
                        "margin": row["top1_val"] - row["top2_val"]}
            n += 1
    return {}
