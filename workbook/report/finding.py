"""The finding: what the runs show, as data and as sentences, counted from each run's files.

``finding(batches)`` is one headline over every batch plus, per batch, the runs by what they
did (without a fault, with an injected fault and the guard off, with the guard on), the
violated runs as stage → cause → first step / row (said per violation kind:
``wording.violation_text``), per run with the guard on what the guard did
(``wording.guard_text``: tokens fixed, fields of its own state repaired, or nothing), and the
runs that did not finish.
``terminal_lines(f)`` is what ``workbook run`` prints at its end. Every count comes from the
runs' own files (``workbook.report.runs``); an interrupted or unfinished batch says what
finished. Not here: HTML (``workbook.report.html``).
"""

from __future__ import annotations

from typing import Any

from workbook.core import hypotheses
from workbook.report import tokens
from workbook.report.runs import (Batch, Run, first_violated, guard_twin,  # noqa: F401
                                  judged_requests, verdict_of)
from workbook.report import wording
from workbook.report.wording import DASH  # noqa: F401

def stage_of(hyp: str | None) -> str | None:
    h = hypotheses.HYPOTHESES.get(hyp or "")
    return h.stage if h else None


def cause_text(v: dict) -> str:
    """The cause named: a run's verdict (``hypothesis``) or a verdict record (``cause``)."""
    hyp = v.get("cause") if "contract" in v else v.get("hypothesis")
    if not hyp:
        return ("no cause named (unclassified)" if v.get("verdict") == "violated"
                else "no cause: nothing was violated")
    t = (v.get("hypothesis_title") if "contract" not in v else None) or \
        hypotheses.title(hyp) or ""
    return f"{hyp}: {t}" if t else str(hyp)


def named_by(run: Run) -> dict:
    """What names the run's cause: its first violated verdict record (the one shape), else
    (no request traced: a verdict from the client alone) its diagnosis."""
    return first_violated(run) or run.verdict


def cause_of(run: Run) -> str | None:
    """The hypothesis id the run's first violation is blamed on (None: none named)."""
    v = named_by(run)
    return v.get("cause") if "contract" in v else v.get("hypothesis")


def stage_text(run: Run) -> str | None:
    """The stage of the run's first violation: the catalogue's stage of its named cause."""
    return stage_of(cause_of(run))


def chain_text(v: dict) -> str | None:
    """The diagnosis' chain (stage → anomaly → cause → confirm), when it gives one."""
    chain = v.get("chain")
    if not chain:
        causes = v.get("causes")
        if not causes:
            return None
        parts = []
        for c in causes if isinstance(causes, list) else [causes]:
            if isinstance(c, dict):
                hid = c.get("hypothesis") or c.get("id")
                parts.append(" — ".join(str(x) for x in (hid, c.get("title") or
                                                          hypotheses.title(hid),
                                                          c.get("reason")) if x))
            else:
                parts.append(str(c))
        return "causes: " + "; ".join(parts)
    if isinstance(chain, str):
        return chain
    steps = []
    for link in chain if isinstance(chain, list) else [chain]:
        if isinstance(link, dict):
            keys = ("stage", "anomaly", "cause", "confirm")
            bits = [f"{link[k]}" if k != "confirm" else f"(confirm: {link[k]})"
                    for k in keys if link.get(k)]
            bits += [f"{k}: {v}" for k, v in link.items() if k not in keys and v and
                     not isinstance(v, (dict, list))][:2]
            steps.append(" → ".join(bits))
        else:
            steps.append(str(link))
    return " ⇒ ".join(steps)


def where_text(run: Run) -> str:
    """``step s, row r (local_pos p, path), request i of n (budget b): <what happened>`` —
    what happened said per violation kind (``wording.violation_text``)."""
    v = run.verdict
    rec = first_violated(run) or {}  # the one shape: request, step, row, local_pos
    fv = v.get("first_violation") or {}  # the budget's own: path, kind, what was emitted
    if not fv and not rec:
        return "no first violating step recorded"
    if not fv:
        fv = {"req_id": rec.get("request")}
    rid = rec.get("request", fv.get("req_id"))
    if rid != fv.get("req_id"):  # the budget's details belong to another request: not said
        fv = {"req_id": rid}
    reqs = judged_requests(run)
    idx = next((r["index"] for r in reqs if r["req_id"] == rid), None)
    req = next((r for r in reqs if r["req_id"] == rid), {})
    which = f"request {idx} of {len(reqs)}" if idx else "request"
    b = fv.get("budget") if "budget" in fv else req.get("budget")
    budget = f" ({wording.budget_text(b)})" if wording.absent(b) or \
        wording.budget_text(b) == wording.NO_BUDGET else f" (budget {wording.budget_text(b)})"
    path = wording.value_text(fv.get("path"), "path not recorded")
    at = rec if rec else fv
    step = wording.value_text(at.get("step"), "not located")
    row = wording.value_text(at.get("row"), "not located")
    lp = wording.value_text(at.get("local_pos"), "not located")
    return (f"step {step}, row {row} (local_pos {lp}, {path}), {which}{budget}: "
            + wording.violation_text(fv, lambda t: tokens.label(run.decode, t)))


def guard_runs(runs: list[Run]) -> list[tuple[Run, str]]:
    """Every run with the guard on and what the guard did there (``wording.guard_text``)."""
    return [(r, wording.guard_text(r.verdict.get("guard"))) for r in runs
            if r.guard and (r.verdict or r.finished_ok)]


def repairs(run: Run) -> list[dict]:
    """Every repair the guard logged in ``run``: the trace's ``guard`` table (all of them),
    else the verdict's ``guard.repairs`` (the first records)."""
    g = run.frames.get("guard") if run.frames else None
    if g is not None and not g.empty:
        return g.to_dict("records")
    return list((run.verdict.get("guard") or {}).get("repairs") or [])


def _category(r: Run) -> str:
    return r.category


def count_line(runs: list[Run]) -> str:
    c: dict[str, int] = {}
    for r in runs:
        key = verdict_of(r) or r.row.get("status") or "unknown"
        if r.row.get("status") not in (None, "ok"):
            key = r.row["status"]
        elif not verdict_of(r):
            key = "finished without a verdict"
        c[key] = c.get(key, 0) + 1
    order = ["honored", "violated", "inconclusive", "failed", "timeout", "interrupted"]
    keys = [k for k in order if k in c] + sorted(k for k in c if k not in order)
    return ", ".join(f"{c[k]} {k}" for k in keys) or "none"


def n_requests(runs: list[Run]) -> tuple[int, int]:
    """(requests that honoured the budget rule, requests judged against it): a request the
    evidence did not judge (``honored`` None: no budget that could bind) is not counted."""
    reqs = [q for r in runs for q in judged_requests(r) if q["honored"] is not None]
    return sum(q["honored"] is True for q in reqs), len(reqs)


def _runs(n: int, what: str = "run") -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def identity(run: Run) -> dict[str, int] | None:
    """Notebook 04's guard on / off comparison on healthy vLLM (``fix.json``): requests
    compared and how many were token-identical; None when the run holds none."""
    rows = (run.fix.get("identity") or {}).get("rows") or []
    if not rows:
        return None
    return {"n": len(rows), "same": sum(bool(r.get("identical")) for r in rows)}


def guard_result(run: Run, runs: list[Run]) -> dict[str, Any] | None:
    """What the guard did for a run with an injected fault, from the evidence: the guard-off
    result (a guarded twin's counterpart, or the run's own ``fix.json``) and the guard-on one.

    ``{"off": run name or "<name> (guard off, fix.json)", "off_violated": bool, "on": name,
    "on_verdict": verdict, "fixed": bool}``; None when the evidence holds no such pair."""
    if run.fault == "none":
        return None
    if not run.guard:
        twin = guard_twin(run, runs)
        if twin is None:
            return None
        return {"off": run.name, "off_violated": verdict_of(run) == "violated", "in_run": False,
                "on": twin.name, "on_verdict": verdict_of(twin) or twin.row.get("status"),
                "fixed": verdict_of(run) == "violated" and verdict_of(twin) == "honored"}
    off = run.guard_off
    if off is None:
        return None
    return {"off": f"{run.name} (guard off, fix.json)", "off_violated": not off["honored"],
            "in_run": True,
            "on": run.name, "on_verdict": verdict_of(run) or run.row.get("status"),
            "fixed": not off["honored"] and verdict_of(run) == "honored"}


def _guard_text(run: Run, runs: list[Run]) -> tuple[str, bool]:
    """(what the evidence says about the guard for a violated run, fixed?)."""
    if run.guard:
        return ("the guard was on, and the budget was still violated: "
                + wording.guard_text(run.verdict.get("guard"))), False
    g = guard_result(run, runs)
    if g is None:
        return "no run of this batch tried the guard on it", False
    if g["fixed"]:
        return f"fixed by the guard ({g['on']}: honored)", True
    return f"NOT fixed by the guard ({g['on']}: {g['on_verdict']})", False


def _planned(b: Batch) -> list[str]:
    return list(b.manifest.get("planned") or [r.name for r in b.runs])


def _batch_state(b: Batch) -> str | None:
    """A sentence when the batch did not run to its end, saying what finished."""
    planned = _planned(b)
    ran = {r.name for r in b.runs}
    ok = [r for r in b.runs if r.finished_ok]
    not_started = [n for n in planned if n not in ran]
    done = (f"{len(ok)} of {_runs(len(planned), 'planned run')} finished"
            + (f"; not started: {', '.join(not_started)}" if not_started else ""))
    intr = b.manifest.get("interrupted") or {}
    if intr:
        return (f"Batch {b.hardware}/{b.run_id} was interrupted by "
                f"{wording.value_text(intr.get('signal'), 'a signal not recorded')} "
                f"during {intr.get('run') or 'the batch'}: {done}.")
    if not b.finished:
        return (f"Batch {b.hardware}/{b.run_id} is unfinished (no closed manifest or no "
                f"SHA256SUMS: its process was killed): {done}.")
    if not_started:
        return f"Batch {b.hardware}/{b.run_id} stopped early: {done}."
    return None


def finding(batches: list[Batch]) -> dict[str, Any]:
    """The finding as data: one headline and, per batch, counts and violated runs.

    Runs are counted by what their own files say they did (``Run.category``); "every run"
    is said only when every planned run finished."""
    all_runs = [r for b in batches for r in b.runs]
    per_batch = []
    for b in batches:
        cats = {k: [r for r in b.runs if r.category == k] for k in ("healthy", "fault", "guard")}
        violated = []
        for r in b.runs:
            if verdict_of(r) != "violated":
                continue
            guard, fixed = _guard_text(r, b.runs)
            v = r.verdict
            violated.append({"run": r, "fault": r.fault, "stage": stage_text(r),
                             "cause": cause_text(named_by(r)), "chain": chain_text(v),
                             "where": where_text(r), "guard": guard, "fixed": fixed})
        bad = [r for r in b.runs if r.row.get("status") not in (None, "ok")]
        per_batch.append({"batch": b, "cats": cats, "violated": violated, "not_ok": bad,
                          "state": _batch_state(b), "guard": guard_runs(b.runs)})
    stopped = [pb["state"] for pb in per_batch if pb["state"]]
    healthy = [r for r in all_runs if r.category == "healthy"]
    judged = [r for r in healthy if r.finished_ok and verdict_of(r)]
    healthy_bad = [r for r in judged if verdict_of(r) == "violated"]
    faults = [r for r in all_runs if r.category == "fault"]
    faults_judged = [r for r in faults if r.finished_ok and verdict_of(r)]
    caught = [r for r in faults_judged if verdict_of(r) == "violated"]
    named = [r for r in caught if cause_of(r)]
    tried = [g for g in (guard_result(r, all_runs) for r in all_runs if r.fault != "none")
             if g is not None and g["off_violated"]]
    fixed = [g for g in tried if g["fixed"]]
    guarded_healthy = [r for r in all_runs if r.category == "guard" and r.fault == "none"
                       and r.finished_ok and verdict_of(r)]
    # the hardware the healthy verdicts come from (not every batch's: a batch of faults only
    # says nothing about healthy vLLM on its hardware)
    hw = " and ".join(sorted({r.hardware for r in judged} or {b.hardware for b in batches}))
    ok_req, n_req = n_requests(judged)
    every = "every run" if not stopped else "every run that finished"
    parts = []  # the first says what healthy vLLM did (when any run without a fault ran)
    if healthy_bad:
        names = ", ".join(f"{r.short} ({cause_text(named_by(r))})" for r in healthy_bad)
        parts.append(f"vLLM ignored thinking_token_budget WITHOUT any injected fault in "
                     f"{len(healthy_bad)} of {_runs(len(judged), 'finished run')}: {names}.")
    elif judged and all(verdict_of(r) == "honored" for r in judged):
        parts.append(f"Healthy vLLM honoured thinking_token_budget in {every} on {hw}: "
                     f"{_runs(len(judged))} without a fault, {ok_req} of {n_req} requests judged "
                     f"with </think> exactly where the budget puts it.")
    elif judged:
        parts.append(f"Runs without a fault on {hw}: {count_line(judged)}.")
    elif healthy:
        parts.append("No run without a fault finished: there is no verdict on healthy vLLM "
                     "here.")
    if faults_judged:
        n = len(faults_judged)
        text = (f"Injected faults with the guard off: the budget was violated in {len(caught)} "
                f"of {_runs(n)}" + (", caught at its first step and row" if len(caught) == 1
                                    else ", each caught at its first step and row"
                                    if caught else ""))
        if caught:
            text += (" with its cause named" if len(named) == len(caught)
                     else f"; a cause was named in {len(named)} of them")
        parts.append(text + ".")
    if tried:
        said = [f"{g['on']}: {g['on_verdict']}" + (
                    " — the same request violated with the guard off in that run"
                    if g["in_run"] else "") for g in tried]
        did = (("fixed" if fixed else "did not fix") + " the one violation" if len(tried) == 1
               else f"fixed {len(fixed)} of the {len(tried)} violations")
        parts.append(f"The guard {did} it was tried on ({'; '.join(said)}).")
    reports = [(r.verdict.get("guard") or {}) for r in all_runs if r.guard and r.finished_ok]
    here = [g for g in reports if g.get("available") is not False and g.get("installed")
            and "fixed_tokens" in g]
    away = [g for g in reports if g.get("available") is False]
    if here or away:
        tok = sum(int(g.get("fixed_tokens") or 0) for g in here)
        fld = sum(int(g.get("repaired_fields") or 0) for g in here)
        text = (f"The guard's own record over the {_runs(len(here))} that reported it: "
                f"{_runs(tok, 'token')} replaced, {_runs(fld, 'field')} of its own state "
                "repaired") if here else "No run recorded what its guard did"
        if away:
            text += (f" ({_runs(len(away))} ran {'its' if len(away) == 1 else 'their'} guard "
                     "in a server worker: not in its files)")
        parts.append(text + ".")
    if guarded_healthy:
        ok = sum(verdict_of(r) == "honored" for r in guarded_healthy)
        parts.append(f"With the guard on healthy vLLM: {ok} of {_runs(len(guarded_healthy))} "
                     "honoured.")
    ident = [(r, identity(r)) for r in all_runs]
    ident = [(r, i) for r, i in ident if i is not None]
    if ident:
        same = sum(i["same"] for _, i in ident)
        total = sum(i["n"] for _, i in ident)
        parts.append(f"Guard on vs off on healthy vLLM: {same} of {total} requests "
                     f"token-identical ({', '.join(r.name for r, _ in ident)}).")
    not_ok = [r for r in all_runs if r.row.get("status") not in (None, "ok")]
    if not_ok:
        parts.append(f"{_runs(len(not_ok))} did not finish ({count_line(not_ok)}).")
    parts += stopped
    warn = bool(stopped or not_ok or not judged)
    return {"headline": " ".join(parts) or "No runs.", "alarm": bool(healthy_bad),
            "warn": warn, "batches": per_batch, "parts": parts,
            "healthy_said": bool(healthy)}


def terminal_lines(f: dict) -> list[str]:
    """What ``workbook run`` prints before the report's path: the headline, then one line
    per violated run (stage → cause → where; the guard's result), then one line per other run
    with the guard on (what the guard fixed and repaired, or that it changed nothing)."""
    lines = [f["headline"]]
    for pb in f["batches"]:
        for v in pb["violated"]:
            r: Run = v["run"]
            fault = f"fault {v['fault']}" if v["fault"] != "none" else "NO fault injected"
            lines.append(f"  violated: {r.short} ({fault}): {v['stage'] or 'stage not named'} "
                         f"→ {v['cause']} → {v['where']}; {v['guard']}")
        for r, said in pb.get("guard") or []:
            if verdict_of(r) != "violated":  # a violated run's line says it already
                lines.append(f"  guard: {r.short}: {said}")
    return lines
