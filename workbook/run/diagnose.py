"""Where was the thinking budget lost? A verdict and a hypothesis from the trace alone.

``diagnose(frames, effective, outcomes=None, cfg=None)`` reads the tracer's tables
(``workbook.hooks.tracer``) and the effective configuration (``workbook.vllm.effective``) and
returns a JSON-able dict:

- ``verdict``: ``honored`` | ``violated`` | ``inconclusive`` (no request whose budget could bind
  within its tokens). Computed per traced request with the one budget rule
  (``workbook.core.budget.judge_from_count``): the request's output is the concatenation of the
  tokens emitted per step; the reasoning section open at its first step holds ``r0`` tokens
  (the tracer's own host-side count of the prompt).
- ``first_violation``: the step, request, logits row and local position that emitted the wrong
  token there, the expected and the emitted token.
- ``hypothesis`` (``workbook.core.hypotheses``) with ``evidence``: the rules below, evaluated in pipeline order on the
  violating request-step and row; the first that fires names the stage where the budget was
  lost. ``unclassified`` (with the evidence rows) when none fits.

  ======  ==========================================================================
  H-h     the effective runner is not MRV2 although V2 was asked for (or no MRV2 step
          was traced while requests ran)
  H-b     ``ThinkingBudgetState.enabled`` is False in the worker
  H-c     the request's budget did not register (``use_thinking_budget`` False, or the
          host budget differs from the request's)
  H-a     registered, but the per-slot gate is off / ``apply_sampling_params`` took its
          fast path
  H-d     the device copy of the budget differs from the host copy
  H-f     ``apply`` ran with a budgeted slot, enabled, but launched no kernel
  H-d     the kernels ran but did not force the row (draft rows: ``local_pos`` > 0)
  H-e     the row was forced after ``apply`` but not in the logits sampling used, or the
          forced row's token is not the end token and no draft explains it
  H-g     the forced row's draft was accepted over the forced end token
  ======  ==========================================================================

It never reads which fault was injected (``cfg`` is used only for the runner that was asked
for); ``outcomes`` (what the client saw) only cross-check the trace and stand in for it when
MRV2 was not traced at all.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from workbook.core import budget, tracefiles
from workbook.core.hypotheses import title

def _markers(frames, effective) -> budget.Markers:
    """The runner's markers as the tracer read them; the effective configuration's otherwise."""
    m = tracefiles.markers(frames) if frames else {}
    return budget.Markers.of(m if m.get("end") else effective)


def _records(df: pd.DataFrame | None) -> list[dict]:
    if df is None or len(df) == 0:
        return []
    return [{k: _py(v) for k, v in r.items()} for r in df.to_dict("records")]


def _py(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, float) and v != v:  # NaN
        return None
    return v


def traced_requests(frames: dict, markers: budget.Markers) -> list[dict]:
    """Per traced request: budget, r0, output tokens, expected end index, honored."""
    regs = _records(frames.get("registrations"))
    reqs = _records(frames.get("requests"))
    out = []
    for reg in regs:
        rid = reg["req_id"]
        steps = sorted((r for r in reqs if r["req_id"] == rid), key=lambda r: r["step"])
        output = [t for r in steps for t in (r["emitted"] or [])]
        if reg.get("max_tokens"):  # the engine drops what a last step emits beyond max_tokens
            output = output[:int(reg["max_tokens"])]
        b = reg.get("budget_param")
        r0 = steps[0]["reasoning_count"] if steps else None
        j = budget.judge_from_count(r0, output, b, markers)
        out.append({"req_id": rid, "budget": b, "r0": r0, "output": output,
                    "expected_end_index": j.expected_end_index, "honored": j.honored,
                    "prompt_len": reg.get("prompt_len"), "registration": reg, "steps": steps})
    return out


def locate(req: dict) -> tuple[dict | None, int | None]:
    """The request-step that emitted output index ``expected_end_index``, and its local pos."""
    e = req["expected_end_index"]
    offset = 0
    for st in req["steps"]:
        n = len(st["emitted"] or [])
        if offset <= e < offset + n:
            return st, e - offset
        offset += n
    return None, None


def _row(frames, step: int, req_id: str, local_pos: int) -> dict | None:
    rows = frames.get("rows")
    if rows is None or len(rows) == 0:
        return None
    sel = rows[(rows["step"] == step) & (rows["req_id"] == req_id)]
    recs = _records(sel)
    by_pos = {r["local_pos"]: r for r in recs}
    return by_pos.get(local_pos), by_pos


def classify(req: dict, st: dict, row: dict | None, rows_by_pos: dict, end: list[int]):
    """First rule (pipeline order) that explains the violation; (hypothesis, reason)."""
    reg = req["registration"]
    budget = req["budget"]
    if reg.get("enabled") is False or st.get("enabled") is False:
        return "H-b", "ThinkingBudgetState.enabled is False in the worker"
    if reg.get("use_thinking_budget") is False or (
            reg.get("budget_host") is not None and reg["budget_host"] != budget):
        return "H-c", (f"registered use_thinking_budget={reg.get('use_thinking_budget')}, "
                       f"host budget={reg.get('budget_host')} for a request with budget {budget}")
    if st.get("gate") is False or st.get("fast_path") is True:
        return "H-a", (f"per-slot gate={st.get('gate')}, fast path={st.get('fast_path')}: "
                       "apply_sampling_params returned the logits unprocessed")
    if st.get("budget_device") is not None and st.get("budget_host") is not None \
            and st["budget_device"] != st["budget_host"]:
        return "H-d", (f"device budget {st['budget_device']} != host budget "
                       f"{st['budget_host']}")
    if st.get("apply_called") and st.get("use_thinking_budget") and \
            st.get("kernels_launched") is False:
        return "H-f", "ThinkingBudgetState.apply ran for a budgeted slot but launched no kernel"
    if row is None:
        return "unclassified", "no logits row was traced for the violating position"
    if not row.get("forced"):
        where = "a draft row" if row["local_pos"] > 0 else "the first row"
        return "H-d", (f"the kernels ran but did not force {where} (local_pos="
                       f"{row['local_pos']}, end logit after apply "
                       f"{row.get('end_logit_after_apply')})")
    if not row.get("forced_final"):
        return "H-e", ("the row was forced after apply (end logit "
                       f"{row.get('end_logit_after_apply'):.3g}) but the logits handed to "
                       f"sampling had {row.get('end_logit_final'):.3g}")
    nxt = rows_by_pos.get(row["local_pos"] + 1)
    if nxt is not None and nxt.get("draft_accepted") and nxt.get("input_token") != end[0]:
        return "H-g", (f"draft {nxt['input_token']} at local_pos {nxt['local_pos']} was "
                       "accepted although the target row forced the end token")
    return "H-e", ("the forced row emitted a token other than the end token, and no accepted "
                   "draft explains it: sampling ignored the processed logits")


def diagnose(frames: dict | None, effective: dict, outcomes=None, cfg=None) -> dict[str, Any]:
    frames = frames or {}
    markers = _markers(frames, effective)
    end = list(markers.end)
    reqs = traced_requests(frames, markers)
    result: dict[str, Any] = {"verdict": "inconclusive", "hypothesis": None,
                              "hypothesis_title": None, "summary": "", "first_violation": None,
                              "evidence": [], "requests": [], "markers": markers.to_dict()}
    client = [_outcome_dict(o) for o in (outcomes or [])]
    result["requests"] = [{k: r[k] for k in ("req_id", "budget", "r0", "expected_end_index",
                                             "honored", "output")} for r in reqs]
    asked_v2 = cfg is None or getattr(cfg, "runner", "v2") == "v2"
    not_v2 = effective.get("runner_is_v2") is False or (
        asked_v2 and not reqs and client and effective.get("runner_is_v2") is not True)
    judged = reqs if reqs else [{"honored": o.get("honored")} for o in client]
    result["verdict"] = budget.overall([r["honored"] for r in judged])
    if not_v2 and asked_v2:
        result["hypothesis"] = "H-h"
        result["evidence"] = [{k: effective.get(k) for k in
                               ("runner_class", "runner_is_v2", "use_v2_model_runner",
                                "env_VLLM_USE_V2_MODEL_RUNNER", "v1_fallback_logged")}]
        result["summary"] = (f"{result['verdict']} — but on {effective.get('runner_class')}, "
                             "not Model Runner V2: this run says nothing about MRV2")
    elif result["verdict"] == "violated":
        bad = next(r for r in reqs if r["honored"] is False)
        st, lp = locate(bad)
        found = _row(frames, st["step"], bad["req_id"], lp) if st is not None else None
        row, by_pos = found if found else (None, {})
        hyp, reason = classify(bad, st or {}, row, by_pos, end)
        e = bad["expected_end_index"]
        result["first_violation"] = {
            "req_id": bad["req_id"], "step": None if st is None else st["step"],
            "path": None if st is None else st["path"],
            "row": None if row is None else row["row"], "local_pos": lp,
            "output_index": e, "expected_token": end[0] if end else None,
            "emitted_token": bad["output"][e] if e is not None and e < len(bad["output"])
            else None}
        result["hypothesis"] = hyp
        result["evidence"] = [_slim(st or {}), row or {}]
        result["summary"] = (f"budget {bad['budget']} violated at step {st and st['step']}, "
                             f"local_pos {lp} ({st and st['path']}): expected "
                             f"{result['first_violation']['expected_token']}, emitted "
                             f"{result['first_violation']['emitted_token']} — {hyp}: {reason}")
        result["reason"] = reason
    elif result["verdict"] == "honored":
        result["summary"] = "every budget that could bind was honored at the exact position"
    else:
        result["summary"] = "no request's budget could bind within its tokens"
    result["hypothesis_title"] = title(result["hypothesis"])
    result["client_agrees"] = _client_agrees(reqs, client)
    return json.loads(json.dumps(result, default=_py))


def _slim(st: dict) -> dict:
    return {k: v for k, v in st.items() if k not in ("proposed",)}


def _outcome_dict(o) -> dict:
    return o.to_dict() if hasattr(o, "to_dict") else dict(o)


def _client_agrees(reqs, client) -> bool | None:
    """Whether every client-side output is exactly one traced request's output."""
    if not reqs or not client:
        return None
    traced = [tuple(r["output"]) for r in reqs]
    return all(tuple(c.get("token_ids") or []) in traced for c in client)

