"""Why was the thinking budget lost? A verdict and its cause, from the trace's direct evidence.

``diagnose(frames, effective, outcomes=None, cfg=None)`` reads the tracer's tables
(``workbook.hooks.observe.tracer``) and the effective configuration (``workbook.vllm.effective``) and
returns a JSON-able dict:

- ``verdict``: ``honored`` | ``violated`` | ``inconclusive`` (no request whose budget could bind
  within its tokens). Computed per traced request with the one budget rule
  (``workbook.core.budget.judge_from_count``): the request's output is the concatenation of the
  tokens emitted per step; the reasoning section open at its first step holds ``r0`` tokens
  (the tracer's own host-side count of the prompt).
- ``violations``: per violated request, the first violation (step, logits row, local position,
  expected and emitted token) and the ``causes`` that fit it; ``first_violation`` is the
  earliest of them.
- ``causes``: a list of ``{hypothesis, title, stage, saw, confirm, requests}`` — every rule that
  fired, over all violated requests; ``hypothesis`` is the single cause when exactly one fits,
  ``"ambiguous"`` when several do (all listed with their evidence), ``"unclassified"`` when
  none does (``anomalies`` then lists the strongest contract breaks seen): never a name by
  elimination.
- ``chain``: one row per cause, stage → anomaly seen → cause → what would confirm it → its
  result (``chain_rows(verdict)`` for tables: notebook 03, the report).
- ``probes``: results of the automatic checks (``workbook.run.budget.probes``, filled by
  ``with_probes``); ``anomalies``: every contract break of the trace (``contract_breaks``),
  empty on healthy vLLM.

In order: the traced requests, each judged (``traced_requests``; a budget the client asked for
and the runner never received judges by the client's); the runner — V2 asked for and not
served is H-h (configuration), and no stage rule runs; per violated request, the request-step
and logits row that emitted its first violating position (``locate``), the evidence there
(``workbook.run.budget.stages.Ctx``) and the causes of the first stage whose contract is broken at
that row (``workbook.run.budget.stages.classify``: the stage rules, state → registration → batch
mapping → gate → launch → device state → apply → sampling, acceptance included → commit);
one name from the causes (``_name``).

The other side of the contract (``budget.forced_not_due``): ``</think>`` forced where it was
not due — before the budget binds (``early``), into a request without a budget
(``unbudgeted``), after reasoning ended (``twice``) — is a violation at the first such output
index; a position counts as forced when the row's bias (+1e9 across ``apply``) is in the
emitted token's column or the token was replaced after sampling (``forced_indices``). Its
causes are the stage rules' ``FORCING_RULES``.

It never reads which fault was injected (``cfg`` is used only for the runner that was asked
for); ``outcomes`` (what the client saw) only cross-check the trace and stand in for it when
MRV2 was not traced at all.

Deliberately not here: the stage rules — which stage broke its contract at the violating row,
and how (``workbook.run.budget.stages``; ``Ctx``, ``RULES``, ``FORCING_RULES`` and ``classify`` are
re-exported here); the verdict helpers any constraint shares (``workbook.run.verdicts``); the
probes themselves (``workbook.run.budget.probes``).
"""

from __future__ import annotations

import json
from typing import Any

from workbook.core import budget, tracefiles
from workbook.core.hypotheses import HYPOTHESES, STAGES, title
from workbook.run.verdicts import (  # noqa: F401 (re-exported: the diagnosis' public names)
    INT_FIELDS, as_int as _int, cause as _cause, chain_rows, dedupe as _dedupe, markers_text,
    Verdict, pointed_by, py as _py, records as _records, say, single as _single)
from workbook.run import verdicts
from workbook.run.budget.evidence_text import (cache_saw, history_saw, mapping_saw,  # noqa: F401
                                        reasoning_state)
from workbook.run.budget.stages import (  # noqa: F401 (re-exported: the stage rules' public names)
    FORCED, FORCING_RULES, RULES, Ctx, classify, end_push, row_forced, inputs_right)


def _markers(frames, effective) -> budget.Markers:
    """The runner's markers as the tracer read them; the effective configuration's otherwise."""
    m = tracefiles.markers(frames) if frames else {}
    return budget.Markers.of(m if m.get("end") else effective)


def forced_indices(steps: list[dict], rows: list[dict], markers: budget.Markers) -> list[int]:
    """Output indices of a request whose end-marker token was forced, from its rows: the row's
    own bias put +1e9 in that token's column (``apply``), a stage raised its column by any
    amount (``stages.end_push``: the trace's end column after each stage — an earlier
    processor, or the budget's apply short of +1e9), or the token was replaced after sampling
    (emitted != sampled: a guard or anything between sampler and commit)."""
    ends = set(int(t) for t in markers.end)
    by_step: dict = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out, offset = [], 0
    for st in steps:
        for r in by_step.get(st["step"], []):
            em = r.get("emitted_token")
            if em is None or not r.get("emitted") or int(em) not in ends:
                continue
            first = markers.end and int(em) == int(markers.end[0])
            biased = int(em) in [int(x) for x in (r.get("bias_cols") or [])] or (
                first and (r.get("end_logit_after_apply") or 0) >= FORCED) or (
                first and end_push(r) is not None)  # any stage, any size of push
            sv = r.get("sampled_vllm")
            if biased or (sv is not None and int(sv) != int(em)):
                out.append(offset + int(r["local_pos"]))
        offset += len(st["emitted"] or [])
    return sorted(out)


def traced_requests(frames: dict, markers: budget.Markers) -> list[dict]:
    """Per traced request: budget, r0, output tokens, expected end index, honored."""
    regs = _records(frames.get("registrations"))
    reqs = _records(frames.get("requests"))
    rows = _records(frames.get("rows"))
    out = []
    for reg in regs:
        rid = reg["req_id"]
        steps = sorted((r for r in reqs if r["req_id"] == rid), key=lambda r: r["step"])
        output = [t for r in steps for t in (r["emitted"] or [])]
        if reg.get("max_tokens"):  # the engine drops what a last step emits beyond max_tokens
            output = output[:int(reg["max_tokens"])]
        b = _int(reg.get("budget_param"))
        r0 = steps[0]["reasoning_count"] if steps else None
        forced = forced_indices(steps, [r for r in rows if r["req_id"] == rid], markers)
        tail = list(reg.get("prompt_tail") or ())
        j = budget.judge_from_count(r0, output, b, markers, forced, tail)
        out.append({"req_id": rid, "budget": b, "r0": r0, "output": output, "prompt_tail": tail,
                    "expected_end_index": j.expected_end_index, "honored": j.honored,
                    "actual_end_index": j.actual_end_index, "kind": j.kind, "at": j.at,
                    "forced": forced,
                    "prompt_len": reg.get("prompt_len"), "registration": reg, "steps": steps})
    return out


def _client_budgets(reqs: list[dict], client: list[dict], markers) -> None:
    """Where the client asked for a budget the runner never received (the request's
    ``thinking_token_budget`` lost before MRV2), judge the traced request by the client's
    budget and keep the runner's as ``budget_runner``. Matched by request id (the engine's is
    the client's plus a suffix), else by a unique identical output."""
    for o in client:
        ob, oid = _int(o.get("budget")), str(o.get("request_id") or "")
        if ob is None:
            continue
        same = [r for r in reqs if oid and (r["req_id"] == oid or
                                            r["req_id"].startswith(oid + "-"))]
        if not same:
            same = [r for r in reqs if r["output"] == list(o.get("token_ids") or [])]
        if len(same) != 1 or same[0]["budget"] == ob:
            continue
        r = same[0]
        j = budget.judge_from_count(r["r0"], r["output"], ob, markers, r["forced"],
                                    r.get("prompt_tail") or ())
        r.update(budget_runner=r["budget"], budget=ob, expected_end_index=j.expected_end_index,
                 honored=j.honored, actual_end_index=j.actual_end_index, kind=j.kind, at=j.at)


def locate(req: dict) -> tuple[dict | None, int | None]:
    """The request-step that emitted the first violating output index (``at``; else
    ``expected_end_index``), and its local pos."""
    e = req.get("at") if req.get("at") is not None else req["expected_end_index"]
    if e is None:
        return None, None
    offset = 0
    for st in req["steps"]:
        n = len(st["emitted"] or [])
        if offset <= e < offset + n:
            return st, e - offset
        offset += n
    return None, None


# ---- trace-wide contract checks (what "unclassified" lists; empty on healthy vLLM) ---------

def contract_breaks(frames: dict, markers: budget.Markers | None = None,
                    limit: int = 50) -> list[dict]:
    """Every budgeted request-step / row where a stage's contract does not hold, grouped by
    check: ``{stage, check, count, first: {step, req_id, local_pos}, saw}``."""
    regs = {r["req_id"]: r for r in _records(frames.get("registrations"))}
    steps = _records(frames.get("requests"))
    rows = _records(frames.get("rows"))
    path_of = {s["step"]: s["path"] for s in _records(frames.get("steps"))}
    found: dict[tuple, dict] = {}

    def hit(stage, check, rec, saw, lp=None):
        key = (stage, check)
        if key not in found:
            found[key] = {"stage": stage, "check": check, "count": 0, "saw": saw,
                          "first": {"step": rec.get("step"), "req_id": rec.get("req_id"),
                                    "local_pos": lp}}
        found[key]["count"] += 1

    budgeted = {rid for rid, r in regs.items() if r.get("budget_param") is not None}
    for s in steps:
        if s["req_id"] not in regs:
            continue
        if s.get("mapping_ok") is False:  # every request: the kernel reads slots through it
            hit("batch mapping", "mapping", s, mapping_saw(s))
        if s["req_id"] not in budgeted:
            if s.get("use_thinking_budget") or (s.get("budget_host") is not None
                                                and int(s["budget_host"]) != -1):
                hit("registration", "registered", s,
                    f"MRV2 registered use_thinking_budget={say(s.get('use_thinking_budget'))}, "
                    f"host budget {say(s.get('budget_host'))} for a request without a budget")
            continue
        b = regs[s["req_id"]]["budget_param"]
        if s.get("enabled") is False:
            hit("state", "enabled", s, "ThinkingBudgetState.enabled was False")
        if s.get("use_thinking_budget") is False or (
                s.get("budget_host") is not None and int(s["budget_host"]) != int(b)):
            hit("registration", "registered", s,
                f"MRV2 registered use_thinking_budget={say(s.get('use_thinking_budget'))}, "
                f"host budget {say(s.get('budget_host'))} for a request with budget {b}")
        if s.get("gate") is False or s.get("fast_path") is True or s.get("apply_called") is \
                False:
            hit("gate", "gate", s, f"the per-slot gate was {say(s.get('gate'))}, the fast path "
                                   f"{say(s.get('fast_path'))}, apply called "
                                   f"{say(s.get('apply_called'))}")
        if s.get("apply_called") and s.get("use_thinking_budget") and \
                s.get("kernels_launched") is False:
            hit("launch", "launched", s, "apply ran for a budgeted slot and launched no kernel")
        if s.get("markers_ok") is False:
            hit("device state", "markers", s, "the device marker ids read "
                                              f"{markers_text(s.get('markers_dev'))}")
        if s.get("budget_device") is not None and s.get("budget_host") is not None and \
                int(s["budget_device"]) != int(s["budget_host"]):
            hit("device state", "budget view", s,
                f"the device budget {s['budget_device']} differs from the host budget "
                f"{s['budget_host']}")
        if s.get("history_ok") is False:
            hit("device state", "history", s, history_saw(s))
        if s.get("positions_ok") is False:
            hit("device state", "positions", s, "local positions / drafts handed to the "
                                                "kernel differ from the batch's")
        if s.get("cache_before_ok") is False:
            hit("device state", "cache before apply", s, cache_saw(s))
        scanned = s.get("kernels_launched") and inputs_right(s) and \
            int(s.get("budget_device") if s.get("budget_device") is not None else -1) >= 0
        if scanned and s.get("cache_scan_ok") is False or (
                scanned and s.get("cache_scan_ok") is None and s.get("cache_after_ok") is False):
            hit("apply", "marker scan", s, "the scan left last_start="
                                            f"{say(s.get('last_start'))}, where "
                                            f"{reasoning_state(s.get('truth_start'))}")
        elif scanned and s.get("cache_scan_ok") and s.get("cache_after_ok") is False:
            hit("device state", "cache after the scan", s, "the scan left the cache right, "
                                                          "apply's exit found it changed")
        if [n for n in (s.get("kernel_substituted") or [])]:
            hit("apply", "kernel inputs", s, f"apply handed the kernel "
                                              f"{say(s['kernel_substituted'])}, not the state's "
                                              "tensors")
    ends = set(int(t) for t in (markers.end if markers is not None else ()))
    for r in rows:
        cols = [int(x) for x in (r.get("bias_cols") or [])]
        if r["req_id"] not in budgeted:
            if cols:
                hit("apply", "non-due row biased", r, f"+1e9 went to column(s) {say(cols)} in "
                                                       "a request without a budget",
                    r["local_pos"])
            sv, em = r.get("sampled_vllm"), r.get("emitted_token")
            if sv is not None and em is not None and int(sv) != int(em) and int(em) in ends:
                hit("commit", "end committed where not due", r, f"{sv} was sampled and {em} "
                                                                "committed", r["local_pos"])
            continue
        if r.get("due"):
            if not row_forced(r):
                if r.get("due_logit_kernel") is not None and r["due_logit_kernel"] >= FORCED:
                    hit("apply", "biased tensor", r, "the kernel forced another tensor",
                        r["local_pos"])
                elif cols:
                    hit("apply", "bias column", r, f"+1e9 went to column(s) {say(cols)}, while "
                                                    f"{say(r.get('due_token'))} was due",
                        r["local_pos"])
                else:
                    hit("apply", "due row unforced", r, "the row was due at count "
                                                         f"{say(r.get('count_host'))} and got "
                                                         "no +1e9", r["local_pos"])
                continue
            ds = r.get("due_logit_sampled")
            if ds is not None and ds < FORCED:
                hit("sampling", "bias reaches the sampler", r, f"the sampled tensor held {ds:.3g}",
                    r["local_pos"])
                continue
            sv = r.get("sampled_vllm")
            if sv is not None and int(sv) != int(r["due_token"]):
                if r.get("from_draft"):
                    hit("acceptance", "draft over forced row", r,
                        f"the draft {sv} was accepted "
                        f"({say(path_of.get(r['step']), 'path not recorded')})", r["local_pos"])
                else:
                    hit("sampling", "forced row sampled", r, f"the forced row sampled {sv}",
                        r["local_pos"])
            em = r.get("emitted_token")
            if sv is not None and em is not None and int(sv) == int(r["due_token"]) and \
                    int(em) != int(sv):
                hit("commit", "committed = sampled", r, f"{sv} was sampled and {em} emitted",
                    r["local_pos"])
        elif cols:
            hit("apply", "non-due row biased", r, f"+1e9 went to column(s) {say(cols)} at "
                                                   f"count {say(r.get('count_host'))}, where "
                                                   "no end was due", r["local_pos"])
        else:
            sv, em = r.get("sampled_vllm"), r.get("emitted_token")
            if sv is not None and em is not None and int(sv) != int(em) and int(em) in ends:
                hit("commit", "end committed where not due", r, f"{sv} was sampled and {em} "
                                                                "committed", r["local_pos"])
    order = list(STAGES)
    return sorted(found.values(), key=lambda a: (order.index(a["stage"]), -a["count"]))[:limit]


# ---- the diagnosis --------------------------------------------------------------------------

def diagnose(frames: dict | None, effective: dict, outcomes=None, cfg=None) -> dict[str, Any]:
    frames = frames or {}
    markers = _markers(frames, effective)
    reqs = traced_requests(frames, markers)
    client = [_outcome_dict(o) for o in (outcomes or [])]
    _client_budgets(reqs, client, markers)
    result: dict[str, Any] = {"verdict": "inconclusive", "hypothesis": None,
                              "hypothesis_title": None, "summary": "", "first_violation": None,
                              "evidence": [], "requests": [], "markers": markers.to_dict(),
                              "causes": [], "chain": [], "probes": {}, "violations": [],
                              "anomalies": []}
    result["requests"] = [{k: r[k] for k in ("req_id", "budget", "r0", "expected_end_index",
                                             "actual_end_index", "honored", "kind", "at",
                                             "forced", "output")}
                          for r in reqs]
    asked_v2 = cfg is None or getattr(cfg, "runner", "v2") == "v2"
    not_v2 = effective.get("runner_is_v2") is False or (
        asked_v2 and not reqs and client and effective.get("runner_is_v2") is not True)
    judged = reqs if reqs else [{"honored": o.get("honored")} for o in client]
    result["verdict"] = budget.overall([r["honored"] for r in judged])
    result["anomalies"] = contract_breaks(frames, markers) if reqs else []
    if not_v2 and asked_v2:
        ev = {k: effective.get(k) for k in ("runner_class", "runner_is_v2",
                                             "use_v2_model_runner",
                                             "env_VLLM_USE_V2_MODEL_RUNNER",
                                             "v1_fallback_logged")}
        runner = say(effective.get("runner_class"), "a runner whose class was not recorded")
        saw = (f"V2 was asked for, and {runner} served the run (runner_is_v2="
               f"{say(effective.get('runner_is_v2'))}); no MRV2 step was traced"
               if not reqs else f"{runner} served the run")
        result["causes"] = [_cause("H-h", saw)]
        result["evidence"] = [ev]
        result["summary"] = (f"{result['verdict']} — but {runner} served it, not Model "
                             "Runner V2: this run says nothing about MRV2")
    elif result["verdict"] == "violated":
        _violations(result, frames, reqs, markers)
    elif result["verdict"] == "honored":
        result["summary"] = "every budget that could bind was honored at the exact position"
    else:
        result["summary"] = "no request's budget could bind within its tokens"
    _name(result)
    result["chain"] = chain_rows(result)
    result["verdicts"] = budget_verdicts(result)
    result["client_agrees"] = _client_agrees(reqs, client)
    return json.loads(json.dumps(result, default=_py))


def _violations(result: dict, frames: dict, reqs: list, markers) -> None:
    end = list(markers.end)
    all_steps = _records(frames.get("requests"))
    all_rows = _records(frames.get("rows"))
    path_of = {s["step"]: s["path"] for s in _records(frames.get("steps"))}
    config = markers.to_dict()  # the configured ids (``_markers``: the runner's, else effective)
    vios = []
    for bad in (r for r in reqs if r["honored"] is False):
        st, lp = locate(bad)
        rows_by_pos: dict = {}
        row = None
        if st is not None:
            rows_by_pos = {r["local_pos"]: r for r in all_rows
                           if r["step"] == st["step"] and r["req_id"] == bad["req_id"]}
            row = rows_by_pos.get(lp)
        e = bad["at"] if bad.get("at") is not None else bad["expected_end_index"]
        kind = bad.get("kind") or "missing"
        fv = {"req_id": bad["req_id"], "budget": bad["budget"], "kind": kind,
              "step": None if st is None else st["step"],
              "path": None if st is None else st["path"],
              "row": None if row is None else row["row"], "local_pos": lp,
              "output_index": e, "expected_token": None if kind != "missing" else
              _int(row.get("due_token")) if row and row.get("due_token") is not None
              else (end[0] if end else None),
              "emitted_token": bad["output"][e] if e is not None and e < len(bad["output"])
              else None,
              "batch_size": None if st is None else st.get("batch_size"),
              "batch": [] if st is None else [
                  {"req_id": s["req_id"], "batch_pos": s.get("batch_pos"),
                   "budget": _budget_of(reqs, s)} for s in all_steps
                  if s["step"] == st["step"]]}
        causes = []
        if st is not None:
            c = Ctx(req=bad, st=st, lp=lp, row=row, rows_by_pos=rows_by_pos, rows=all_rows,
                    steps=all_steps, markers=markers, config_markers=config, path_of=path_of)
            causes = classify(c)
        vios.append({"req_id": bad["req_id"], "budget": bad["budget"], "kind": kind,
                     "first_violation": fv,
                     "expected_end_index": e, "actual_end_index": bad["actual_end_index"],
                     "causes": causes, "hypothesis": _single(causes),
                     "evidence": [_slim(st or {}), row or {}]})
    vios.sort(key=lambda v: (v["first_violation"]["step"] is None,
                             v["first_violation"]["step"] or 0,
                             v["first_violation"]["local_pos"] or 0))
    result["violations"] = vios
    first = vios[0]
    result["first_violation"] = first["first_violation"]
    result["evidence"] = first["evidence"]
    merged: dict[str, dict] = {}
    for v in vios:
        for cse in v["causes"]:
            m = merged.setdefault(cse["hypothesis"], {**cse, "requests": []})
            m["requests"].append(v["req_id"])
    result["causes"] = list(merged.values())
    # the offset pattern: expected vs actual end index of every budgeted request
    result["offsets"] = [{"req_id": r["req_id"], "budget": r["budget"],
                          "expected_end_index": r["expected_end_index"],
                          "actual_end_index": r["actual_end_index"], "honored": r["honored"]}
                         for r in reqs if r["budget"] is not None]


def _budget_of(reqs: list, s: dict) -> int | None:
    """A request's budget as asked (None: none), from its registration."""
    r = next((r for r in reqs if r["req_id"] == s["req_id"]), None)
    return None if r is None else _int(r["budget"])


def _name(result: dict) -> None:
    """``hypothesis``, ``hypothesis_title``, ``reason`` and the summary from ``causes``."""
    causes = result.get("causes") or []
    if causes and causes[0]["hypothesis"] == "H-h":  # the summary says it already
        result["hypothesis"] = "H-h"
        result["hypothesis_title"] = title("H-h")
        result["reason"] = causes[0]["saw"]
        return
    if result["verdict"] != "violated":
        result["hypothesis"] = None
        result["hypothesis_title"] = None
        return
    hyp = _single(causes)
    result["hypothesis"] = hyp
    result["hypothesis_title"] = title(hyp)
    head = _head(result.get("first_violation") or {})
    n_bad = len(result.get("violations") or [])
    if n_bad > 1:
        head += f" (and {n_bad - 1} more violated request{'s' if n_bad > 2 else ''})"
    reason = _reason(hyp, causes, result.get("anomalies") or [])
    result["reason"] = reason
    result["summary"] = f"{head} — {hyp}: {reason}"


def _head(fv: dict) -> str:
    """Where and how one budget broke: "budget B violated at step S, local_pos J (path): ..."."""
    kind = fv.get("kind") or "missing"
    asked = _asked(fv.get("budget"))
    where = (f"at step {say(fv.get('step'), 'not located')}, local_pos "
             f"{say(fv.get('local_pos'), 'not located')} "
             f"({say(fv.get('path'), 'path not recorded')})")
    emitted = say(fv.get("emitted_token"), "no token (the output ended)")
    if kind == "missing":
        return (f"{asked} violated {where}: expected "
                f"{say(fv.get('expected_token'), 'the end marker')}, emitted {emitted}")
    return (f"{asked} violated {where}: {budget.VIOLATION_KINDS[kind]} (output index "
            f"{say(fv.get('output_index'), 'not recorded')}, token {emitted})")


def _asked(b) -> str:
    """Whose budget broke, as the head of a sentence: a request without a budget breaks the
    contract too (an end forced into it), never "no budget violated"."""
    return "budget " + say(b) if b is not None else \
        "the budget's contract, in a request without a budget,"


def _reason(hyp: str, causes: list, anomalies: list) -> str:
    if hyp == "unclassified":
        return ("no rule fits; strongest anomalies: " + "; ".join(
            f"{a['stage']}/{a['check']} ×{a['count']}: {a['saw']}" for a in anomalies[:3])
            if anomalies else "no rule fits and no contract break was seen")
    if hyp == "ambiguous":
        return "several causes fit — " + " | ".join(
            f"{c['hypothesis']}: {c['saw']}" for c in causes)
    return causes[0]["saw"]


def budget_verdicts(result: dict) -> list[dict]:
    """The diagnosis as the one verdict shape (``verdicts.Verdict``), one per traced request:
    its thinking budget held, violated (first step, row, the column due or forced, the stage
    and cause of the first broken stage, the sentence) or not judged (it could not bind)."""
    vios = {v["req_id"]: v for v in result.get("violations") or []}
    out = []
    for r in result.get("requests") or []:
        rid, b = r["req_id"], r.get("budget")
        asked = _asked(b)
        v = vios.get(rid)
        if r.get("honored") is False and v is not None:
            fv = v["first_violation"]
            causes = v.get("causes") or []
            hyp = v.get("hypothesis") or _single(causes)
            reason = _reason(hyp, causes, result.get("anomalies") or [])
            if v is result["violations"][0] and result.get("hypothesis"):  # probes fed back
                hyp, reason = result["hypothesis"], result.get("reason") or reason
            stage = next((c.get("stage") for c in causes if c.get("hypothesis") == hyp),
                         causes[0].get("stage") if causes else None)
            col = fv.get("expected_token") if fv.get("kind") == "missing" \
                else fv.get("emitted_token")
            out.append(Verdict(
                rid, "thinking_token_budget", "violated", step=fv.get("step"),
                row=fv.get("row"), local_pos=fv.get("local_pos"), column=col,
                output_index=fv.get("output_index"), stage=stage,
                cause=hyp if hyp in HYPOTHESES else None,
                evidence=f"{_head(fv)} — {hyp}: {reason}").to_dict())
        elif r.get("honored") is False:  # judged by the client only (no traced step)
            out.append(Verdict(rid, "thinking_token_budget", "violated",
                               output_index=r.get("at"), stage=None,
                               evidence=f"{asked} violated, output index "
                                        f"{say(r.get('at'), 'not recorded')}: no MRV2 step "
                                        "was traced to locate it").to_dict())
        elif r.get("honored") is True:
            end = r.get("actual_end_index")
            out.append(Verdict(rid, "thinking_token_budget", "held", evidence=(
                f"{asked} held: the end of reasoning at output index {say(end)}, where the "
                "budget put it" if b is not None and end is not None else
                f"{'no budget asked; ' if b is None else asked + ' '}held: no end of "
                "reasoning was forced where none was due")).to_dict())
        else:
            out.append(Verdict(rid, "thinking_token_budget", "not judged", evidence=(
                f"{'no budget asked: it' if b is None else asked} could not bind within the request's "
                f"{len(r.get('output') or [])} output tokens")).to_dict())
    return out


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


def with_probes(verdict: dict, probes: dict) -> dict:
    """``verdicts.with_probes`` with the budget's own summary (``_name``) and verdict
    records (``budget_verdicts``)."""
    v = verdicts.with_probes(verdict, probes, namer=_name)
    if "verdicts" in verdict:  # a diagnosis' own records follow the name the probes give
        v["verdicts"] = budget_verdicts(v)
    return v
