"""Parallel sampling in the constraints grid (the ``n`` axis): each of a request's ``n`` outputs
judged as the request it is inside the engine.

vLLM fans a request with ``SamplingParams.n`` > 1 out into ``n`` child requests before the
engine core (``vllm/v1/engine/parallel_sampling.py``, ``ParentRequest.get_child_info``: child
``i`` is ``f"{i}_{parent_id}"`` with the parent's prompt and ``n=1``), and folds their outputs
back into one ``RequestOutput`` whose ``outputs[k].index`` is the child's ``i``. The row check
(``workbook.hooks.observe.rowcheck``) sees the children: each has its own request id, slot and
rows, and every child has the same prompt, so a prompt alone no longer names the request.
``request_ids`` names, per output and per completion, the engine request: by the child index
in the id (vLLM's own naming), else — a version that names children otherwise — by the
tokens the row check saw it emit, in registration order. Every sample is judged
(``cases.judge_request`` on ``view``); the cell is the first sample that is not held
(``pick``), with every sample's verdict in ``Cell.samples``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from types import SimpleNamespace

_CHILD = re.compile(r"^(\d+)_")
_RANK = {"violated": 0, "error": 1, "not judged": 2, "holds": 3}


def request_ids(rc, outs: list) -> list[list[str | None]]:
    """Per ``RequestOutput`` of ``outs``, per completion (in ``outputs`` order): the row
    check's request id of that sample (None where none was observed)."""
    order = [r["req_id"] for r in rc.registrations]
    order += [r for r in rc.prompts if r not in order]
    by_prompt: dict[tuple, list[str]] = {}
    for r in order:
        if r in rc.prompts:
            by_prompt.setdefault(tuple(rc.prompts[r]), []).append(r)
    out = []
    for o in outs:
        cands = by_prompt.get(tuple(o.prompt_token_ids or ()), [])
        comps = list(o.outputs)
        if len(comps) <= 1:
            out.append([cands[-1] if cands else None])
            continue
        free = list(cands)
        got: list[str | None] = []
        for k, comp in enumerate(comps):
            idx = getattr(comp, "index", k)
            r = next((c for c in free if (m := _CHILD.match(c)) and int(m.group(1)) == idx),
                     None)
            if r is None:
                toks = [int(t) for t in comp.token_ids]
                r = next((c for c in free if [e["emitted_token"] for e in rc.emitted_rows(c)]
                          [:len(toks)] == toks), None)
            if r is not None:
                free.remove(r)
            got.append(r)
        out.append(got)
    return out


def view(o, i: int):
    """Output ``o`` as if it held sample ``i`` alone (what ``judge_request`` reads)."""
    if len(o.outputs) <= 1:
        return o
    return SimpleNamespace(prompt_token_ids=o.prompt_token_ids, outputs=[o.outputs[i]],
                           prompt_logprobs=getattr(o, "prompt_logprobs", None),
                           num_cached_tokens=getattr(o, "num_cached_tokens", None))


def key(name: str, i: int) -> str:
    """The evidence key of sample ``i`` > 0 of case ``name`` (sample 0 keeps ``name``)."""
    return f"{name}#sample{i}"


def pick(cells: list, reqs: list) -> object:
    """The case's cell: one sample's as is; several: the first that is not held (violated
    before error before not judged), its message naming the sample, every sample's verdict
    in ``samples``."""
    if len(cells) == 1:
        return cells[0]
    i = min(range(len(cells)), key=lambda k: (_RANK.get(cells[k].status, 1), k))
    cell = cells[i]
    cell.samples = [{"index": k, "n": len(cells), "req_id": r, "status": c.status,
                     "first": c.first, "output": c.output}
                    for k, (c, r) in enumerate(zip(cells, reqs))]
    if cell.status != "holds":
        cell.message = "; ".join(x for x in (f"sample {i} of {len(cells)}", cell.message) if x)
    return cell


def evidence(rc, req: str | None, verdict: dict | None) -> dict:
    """One request's row evidence (``evidence/<method>/<batch>.json``: per case, and per
    sample ``key(name, i)`` beside it)."""
    params = rc.params.get(req) if req is not None else None
    return {"req_id": req, "registration": next(
        (r for r in rc.registrations if r["req_id"] == req), None),
        "params": None if params is None else json.loads(json.dumps(asdict(params),
                                                                    default=str)),
        "steps": [s for s in rc.steps if s["req_id"] == req],
        "verdict": verdict, "errors": rc.errors,
        "prompt_rows": rc.prompt_rows(req) if req is not None else {}}
