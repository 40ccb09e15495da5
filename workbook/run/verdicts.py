"""A per-request verdict from its causes, independent of which sampling constraint it judges.

The generic part of a diagnosis (``workbook.run.budget.diagnose`` is the thinking budget's): reading
the trace tables back (``records``: integers stay integers, JSON columns decoded), a cause
from the catalogue (``cause``), one name from several causes (``single``: the cause, or
``ambiguous`` / ``unclassified`` — never a name by elimination), the automatic probes fed back
(``with_probes``: a contradicting result refutes, positive evidence derived from the
catalogue's predictions, ``pointed_by``; a cause that ``awaits`` a probe says its result:
``settled``) and the chain the notebooks and the report show (``chain_rows``). Values in a
sentence: ``say`` / ``markers_text`` (never None, NaN or a Python repr).

``Verdict``: the ONE record of one contract of one request, judged — what the thinking
budget's diagnosis (``workbook.run.budget.diagnose``: ``verdicts``) and the constraints' row judge
(``workbook.run.constraints.rowjudge``: each request's ``verdicts``) both produce and the report reads: the
contract, held / violated / not judged, the first violating step, row and column, the stage
(``workbook.core.stages``), the cause, the evidence sentence and ``affected_by`` (another
request's constraint found on this request's rows, although its own contracts held).

Deliberately not here: any rule about what a stage must do (the constraint's module), the
probes themselves (``workbook.run.budget.probes``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pandas as pd

from workbook.core import tracefiles
from workbook.core.hypotheses import HYPOTHESES, NO_PREDICTION_WHEN_FORCED


# columns that hold integers (token ids, budgets, counts, slots): a table where one of them is
# missing reads them as floats (pandas: None -> NaN makes the column float64); they are ints
# again here, before any rule, text or probe sees them (a budget is never 1.0)
INT_FIELDS = frozenset((
    "step", "slot", "batch_slot", "prompt_len", "budget_param", "max_tokens", "budget_host",
    "budget_device", "budget", "total_len_before", "total_len_after", "reasoning_count",
    "truth_start", "last_start", "last_end", "scan_pos", "last_start_before", "last_end_before",
    "scan_pos_before", "cache_ref_start", "total_len_dev", "kernel_budget", "kernel_total_len",
    "num_logits", "num_drafts", "num_sampled_vllm", "num_sampled", "num_rejected",
    "batch_pos", "batch_size", "row", "local_pos", "input_token", "sampled_vllm",
    "emitted_token", "count_host", "due_token", "sampled_top", "n_bias_cols", "num_reqs",
    "num_draft_tokens", "guard_fixed"))


VERDICTS = ("held", "violated", "not judged")


@dataclass
class Verdict:
    """One contract of one request, judged (the one shape; ``to_dict`` for files)."""
    request: str
    contract: str
    verdict: str  # VERDICTS
    step: int | None = None  # the first violating engine step (None: held, or not located)
    row: int | None = None  # its logits row in that step
    local_pos: int | None = None  # the row's position within the request (0: no draft)
    column: int | None = None  # the token column that broke (or the token at fault)
    output_index: int | None = None
    stage: str | None = None  # workbook.core.stages.NAMES, or stages.UNLOCATED
    cause: str | None = None  # the named cause (the budget: a hypothesis id), if any
    evidence: str = ""  # the sentence, from the evidence it cites
    # [{request, contract, step, row, column, evidence}]: another request's constraint on
    # this request's rows (not a breach of this request's own contracts)
    affected_by: list = field(default_factory=list)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {self.verdict!r}")

    def to_dict(self) -> dict:
        return asdict(self)


CELL_VERDICT = {"holds": "held", "violated": "violated", "not judged": "not judged"}


def touched_by(affected_by: list) -> list[dict]:
    """The row judge's ``affected_by`` entries in the verdict's shape."""
    return [{"request": a.get("by_name") or a.get("by_request"), "contract": a.get("contract"),
             "step": a.get("step"), "row": a.get("row"), "column": a.get("column"),
             "evidence": a.get("what") or ""} for a in affected_by or []]


def of_cell(cell: dict) -> dict | None:
    """A constraints grid cell (``workbook.run.constraints.cases.Cell.to_dict()``) as the one
    verdict record of its request's contract; None for a cell that judged nothing (refused,
    method refused, error, not run)."""
    verdict = CELL_VERDICT.get(cell.get("status"))
    if verdict is None:
        return None
    f = cell.get("first") or {}
    if verdict == "violated":
        evidence = f.get("what") or ""
    elif verdict == "held":
        skipped = cell.get("unreachable_rows") or 0
        evidence = (f"held at {cell.get('rows', 0)} rows ({cell.get('draft_rows', 0)} draft, "
                    f"{cell.get('accepted_drafts', 0)} accepted) and on the output"
                    + (f"; {skipped} draft row(s) after a draft that breaks a forced column "
                       "not judged (never used)" if skipped else ""))
    else:
        evidence = cell.get("message") or ""
    return Verdict(
        request=f"{cell.get('constraint')} / {cell.get('method')} / {cell.get('batch')}",
        contract=f.get("contract") or cell.get("constraint"), verdict=verdict,
        step=f.get("step"), row=f.get("row"), local_pos=f.get("local_pos"),
        column=f.get("column"), output_index=f.get("out_index"), stage=f.get("stage"),
        cause=f.get("cause"),
        evidence=evidence, affected_by=touched_by(cell.get("affected_by"))).to_dict()


def verdict_text(v: dict) -> str:
    """One verdict record as a sentence: "request r: <contract> held" / "... violated at step
    S, row R (column C, output index I), stage X (cause Y): <evidence>", and who touched it."""
    head = f"request {say(v.get('request'))}: {say(v.get('contract'))} {v.get('verdict')}"
    if v.get("verdict") == "violated":
        where = (f"at step {say(v.get('step'))}, row {say(v.get('row'))}"
                 if v.get("step") is not None else "at no located step")
        extra = [f"column {say(v['column'])}" if v.get("column") is not None else None,
                 f"output index {say(v['output_index'])}"
                 if v.get("output_index") is not None else None]
        extra = [e for e in extra if e]
        where += f" ({', '.join(extra)})" if extra else ""
        head += f" {where}, stage {say(v.get('stage'), 'not named')}"
        if v.get("cause"):
            head += f" (cause {say(v['cause'])})"
    if v.get("evidence"):
        head += f": {v['evidence']}"
    for a in v.get("affected_by") or []:
        head += (f"; touched by request {say(a.get('request'))}'s {say(a.get('contract'))} at "
                 f"step {say(a.get('step'))}, row {say(a.get('row'))}")
    return head


def records(df: pd.DataFrame | None) -> list[dict]:
    if df is None or len(df) == 0:
        return []
    return [{k: decode(k, int_field(k, py(v))) for k, v in r.items()}
            for r in df.to_dict("records")]


def int_field(k, v):
    if k in INT_FIELDS and isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def decode(k, v):
    if k in tracefiles.JSON_COLUMNS and isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def py(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, float) and v != v:  # NaN
        return None
    if v is pd.NA:
        return None
    return v


def as_int(v):
    return None if v is None else int(v)


# ---- values said in a sentence (never None, NaN, a Python list or dict) -----------------------

def say(v, missing: str = "not recorded") -> str:
    """One value for a sentence: an integer without ".0", a list as "a, b" ("none" when
    empty), a dict as "key value, ...", a float to 3 digits; ``missing`` for None / NaN."""
    v = py(v)
    if v is None:
        return missing
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.3g}"
    if isinstance(v, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {say(x, missing)}"
                         for k, x in v.items()) or "none"
    if isinstance(v, (list, tuple)):
        return ", ".join(say(x, missing) for x in v) or "none"
    return str(v)


def markers_text(m) -> str:
    """Marker ids as words: "start 368, end 369, natural end 369" (a multi-token marker's ids
    joined by spaces); "not recorded" when absent."""
    m = py(m)
    if not m:
        return "not recorded"
    if not isinstance(m, dict):
        return say(m)
    return ", ".join(f"{str(k).replace('_', ' ')} " + (" ".join(say(t) for t in x) or "none"
                                                       if isinstance(x, (list, tuple))
                                                       else say(x))
                     for k, x in m.items())


def cause(hyp: str, saw: str, stage: str | None = None, **extra) -> dict:
    h = HYPOTHESES[hyp]
    return settled({"hypothesis": hyp, "title": h.title, "stage": stage or h.stage, "saw": saw,
                    "confirm": h.confirm, **extra})


# a cause whose evidence leaves one question to a probe (``awaits``): the question and the
# probe's name in a sentence
PROBE_QUESTIONS = {"alone": ("the batch-of-one probe (the request re-sent alone)",
                             "batch composition")}


def settled(c: dict, probes: dict | None = None) -> dict:
    """A cause that ``awaits`` a probe says that probe's result, not a fixed story: its
    ``saw`` is the evidence (``seen``) followed by what the probe showed — confirmed (the
    result the catalogue predicts for the cause), refuted (the opposite), or not run (the
    question stays open, and says so)."""
    probe = c.get("awaits")
    if not probe:
        return c
    seen = c.get("seen") or c["saw"]
    name, question = PROBE_QUESTIONS.get(probe, (f"the probe '{probe}'", "this cause"))
    p = (probes or {}).get(probe) or {}
    got = p.get("verdict")
    want = HYPOTHESES[c["hypothesis"]].predicts.get(probe) if c["hypothesis"] in HYPOTHESES \
        else None
    if got in ("honored", "violated") and want in ("honored", "violated"):
        tail = (f"{name} confirmed it: alone, the request was {got}" if got == want else
                f"{name} refuted it: alone, the request was {got} as in the batch")
        if probe != "alone":
            tail = (f"{name} confirmed it ({got})" if got == want else
                    f"{name} refuted it ({got}, where this cause predicts {want})")
    elif got is not None or p.get("ran"):
        tail = f"{question} is not excluded: {name} was {say(got, 'inconclusive')}"
    elif p:
        tail = (f"{question} is not excluded: {name} did not run "
                f"({say(p.get('why'), 'no reason recorded')})")
    else:
        tail = f"{question} is not excluded: {name} has not run"
    return {**c, "seen": seen, "saw": f"{seen}; {tail}"}


def single(causes: list[dict]) -> str:
    hyps = {c["hypothesis"] for c in causes}
    if len(hyps) == 1:
        return next(iter(hyps))
    return "ambiguous" if hyps else "unclassified"


def dedupe(causes: list[dict]) -> list[dict]:
    seen, out = set(), []
    for cse in causes:
        if cse["hypothesis"] not in seen:
            seen.add(cse["hypothesis"])
            out.append(cse)
    return out


def name_from_causes(result: dict) -> None:
    """The generic naming: ``hypothesis`` (``single``), its title and ``reason``."""
    from workbook.core.hypotheses import title

    causes = result.get("causes") or []
    hyp = single(causes)
    result["hypothesis"], result["hypothesis_title"] = hyp, title(hyp)
    result["reason"] = causes[0]["saw"] if hyp not in ("ambiguous", "unclassified") else \
        " | ".join(f"{c['hypothesis']}: {c['saw']}" for c in causes)
    result["summary"] = f"{result['verdict']} — {hyp}: {result['reason']}"


# ---- probes fed back, and the chain ----------------------------------------------------------

def pointed_by(probe: str, outcome: str = "honored") -> list[str]:
    """The hypotheses a probe result is positive evidence for on its own, derived from the
    catalogue's predictions (``Hypothesis.predicts``): a switch that turns the violation into
    ``honored`` shows the thing it switched was the cause, when the hypotheses predicting that
    are the only ones that do and every other hypothesis of the catalogue predicts the
    opposite (markers re-uploaded -> H-i / H-i-inband, device budget re-copied -> H-d, caches
    reset -> H-d-cache, batch of 1 -> H-j). A result some hypothesis makes no prediction for
    (MTP off, V1, the guard) points to nothing: it only refutes."""
    preds = {h.id: h.predicts for h in HYPOTHESES.values() if h.predicts}
    fit = [h for h, p in preds.items() if p.get(probe) == outcome]
    other = "violated" if outcome == "honored" else "honored"
    if outcome == "honored" and fit and all(p.get(probe) == other for h, p in preds.items()
                                            if h not in fit):
        return fit
    return []


def with_probes(verdict: dict, probes: dict, namer=None) -> dict:
    """The verdict with the probes' results fed back (``probes``: ``workbook.run.budget.probes.run``'s
    result, name -> {verdict, recorrupted, ...}):

    - a result that matches a cause's prediction confirms it (``confirmed_by``);
    - a result that contradicts it refutes it (``refuted_by``) — with one exception that needs
      positive evidence: a repair probe (one whose ``honored`` points to the cause,
      ``pointed_by``) that stayed violated while its own trace observed the repaired value
      changed again (``recorrupted``) shows a writer that re-corrupts it; the cause is kept,
      ``reproduced_by`` that probe, and its text says so;
    - a result that is positive evidence on its own (``pointed_by``) adds its causes unless
      another probe contradicts them;
    - ``hypothesis`` / ``chain`` / summary recomputed (several left: ambiguous; none: the
      refuted candidates are listed; ``namer(verdict)`` recomputes hypothesis, reason and
      summary from ``causes`` — the constraint's own wording)."""
    v = json.loads(json.dumps(verdict))
    v["probes"] = probes
    if v.get("verdict") != "violated":
        v["chain"] = chain_rows(v)
        return v
    results = {n: p for n, p in (probes or {}).items() if p.get("verdict") in ("honored",
                                                                              "violated")}

    forced_side = ((v.get("first_violation") or {}).get("kind") or "missing") != "missing"

    def judged(hyp: str) -> tuple[list, list, list]:
        pred = dict(HYPOTHESES[hyp].predicts) if hyp in HYPOTHESES else {}
        if forced_side:  # the predictions that hold on the "missing" side only
            for n in NO_PREDICTION_WHEN_FORCED:
                pred.pop(n, None)
        confirmed = [n for n, p in results.items() if pred.get(n) == p["verdict"]]
        contra = [n for n, p in results.items() if pred.get(n) not in (None, p["verdict"])]
        again = [n for n in contra if results[n].get("recorrupted")
                 and hyp in pointed_by(n)]
        return confirmed, [n for n in contra if n not in again], again

    causes = [settled(dict(c), probes) for c in v.get("causes") or []]
    for c in causes:
        c["confirmed_by"], c["refuted_by"], again = judged(c["hypothesis"])
        if again:
            c["reproduced_by"] = again
            c["saw"] = c["saw"] + "".join(
                f" — probe '{n}' repaired it, yet its own trace saw the repaired value changed "
                f"again ({results[n]['recorrupted']}): a writer re-corrupts it" for n in again)
    kept = [c for c in causes if not c["refuted_by"]]
    have = {c["hypothesis"] for c in kept}
    for name, p in results.items():
        if p["verdict"] != "honored":
            continue
        points = pointed_by(name)
        if have.intersection(points):  # the trace already chose among what it points to
            continue
        for hyp in points:
            if hyp in have:
                continue
            confirmed, refuted, _again = judged(hyp)
            if refuted:
                continue
            switch = say(p.get("switch"), "its switch not recorded")
            kept.append(cause(hyp, f"probe '{name}' ({switch}): honored, while the run "
                                    "itself was violated", from_probe=name,
                               confirmed_by=confirmed, refuted_by=[]))
            have.add(hyp)
    v["refuted"] = [c for c in causes if c["refuted_by"]]
    v["causes"] = kept
    (namer or name_from_causes)(v)
    if v["hypothesis"] == "unclassified" and v["refuted"]:
        v["reason"] = ("the probes refute every candidate (" + ", ".join(
            f"{c['hypothesis']} by {say(c['refuted_by'])}" for c in v["refuted"]) + "); " +
            (v.get("reason") or ""))
        v["summary"] = v["summary"].split(" — ")[0] + " — unclassified: " + v["reason"]
    v["chain"] = chain_rows(v)
    return v


def chain_rows(verdict: dict) -> list[dict]:
    """One row per cause (and per refuted candidate): stage → anomaly seen → cause → what
    would confirm it → its result. The table notebook 03 and the report show."""
    probes = verdict.get("probes") or {}
    rows = []

    def result_of(c: dict) -> str:
        if not probes:
            return "not run (run with probes=True)"
        parts = []
        pred = dict(HYPOTHESES[c["hypothesis"]].predicts) if c["hypothesis"] in HYPOTHESES \
            else {}
        if ((verdict.get("first_violation") or {}).get("kind") or "missing") != "missing":
            for n in NO_PREDICTION_WHEN_FORCED:
                pred.pop(n, None)
        again = c.get("reproduced_by") or []
        for n, p in probes.items():
            if p.get("verdict") not in ("honored", "violated"):
                continue
            want = pred.get(n)
            mark = " ↻ (the repaired value changed again: re-corrupted)" if n in again else \
                "" if want is None else (" ✓" if want == p["verdict"] else " ✗")
            parts.append(f"{n}: {p['verdict']}{mark}")
        return ", ".join(parts) or "no probe applied"

    for c in verdict.get("causes") or []:
        rows.append({"stage": c.get("stage"), "anomaly": c.get("saw"),
                     "cause": f"{c['hypothesis']}: {c.get('title')}",
                     "confirm": c.get("confirm"), "result": result_of(c),
                     "status": "named" if verdict.get("hypothesis") == c["hypothesis"]
                     else "candidate"})
    for c in verdict.get("refuted") or []:
        rows.append({"stage": c.get("stage"), "anomaly": c.get("saw"),
                     "cause": f"{c['hypothesis']}: {c.get('title')}",
                     "confirm": c.get("confirm"), "result": result_of(c),
                     "status": f"refuted by {', '.join(c.get('refuted_by') or [])}"})
    if verdict.get("hypothesis") == "unclassified" and not rows:
        for a in (verdict.get("anomalies") or [])[:5]:
            rows.append({"stage": a["stage"], "anomaly": f"{a['check']} ×{a['count']}: "
                                                         f"{a['saw']}",
                         "cause": "unclassified", "confirm": "probes: batch of 1, markers "
                         "re-uploaded, device state refreshed, guard on",
                         "result": result_of({"hypothesis": ""}), "status": "anomaly"})
    return rows


# --- from a violation to its upstream report (workbook report-issue) ------------------------

def cell_key(cell: dict) -> str:
    """A grid cell's name on the command line: ``constraint/method/batch[@axis=value,...]``
    (``workbook report-issue --cell``)."""
    ax = ",".join(f"{k}={v}" for k, v in (cell.get("axes") or {}).items())
    return f"{cell['constraint']}/{cell['method']}/{cell['batch']}" + (f"@{ax}" if ax else "")


def report_lines(source: str, key: str | None = None, indent: str = "    ") -> list[str]:
    """The two commands printed under a violation: its reproducer on plain vLLM and its
    upstream report (``workbook report-issue``, which also says when the violation is a
    registered finding or was planted)."""
    cell = f" --cell '{key}'" if key else ""
    return [f"{indent}reproduce on plain vLLM: workbook report-issue {source}{cell} --repro "
            "repro.py && python repro.py MODEL_DIR",
            f"{indent}upstream report: workbook report-issue {source}{cell} -o issue.md"]
