"""One self-contained HTML report over run folders of ``workbook run`` (any hardware).

``write(run_dirs, path)`` builds, from the files each run folder holds (``manifest.json``,
``environment.json`` and each run's evidence via ``workbook.core.rundir.load_run``), a page that
leads with the finding and then shows the evidence:

1. **Finding** — one sentence over everything, then per hardware and batch: verdict counts
   (runs without a fault, runs with an injected fault, runs with the guard), each violated run
   as stage → cause → first step / row (and the diagnosis' ``chain`` / ``causes`` when it gives
   them), and whether the guard fixed it; per run with the guard on, what the guard did
   (tokens fixed, fields of its own state repaired — or that it changed nothing);
   interrupted or unfinished batches say so here.
2. **Verdicts** — a run × batch matrix and one table over every run (no paging; every request
   of a run judged); links to each run's executed notebook rendered as HTML.
3. **Violations** — (and **What the guard did**: every repair each guarded run logged) per
   violated run: the steps × rows picture of the violating request
   (``workbook.report.grid``: decoded tokens, forced / accepted / emitted, the budget's cell),
   the end-token logit before and after the bias at that step, and the first divergence from
   the nearest honoured run (its guarded twin when there is one).
4. **Where </think> came** (every request of every run), failures, time per run, run folders,
   the effective configuration (what differs between runs, what is common), collect-env.
5. **Constraints under speculative decoding** — the constraint × method grid of each
   ``grid.json`` found (``workbook.report.constraints``); no section when there is none.

The runs and what each did are ``workbook.report.runs``'s, the finding's counts and sentences
``workbook.report.finding``'s, the page machinery (tables, itables offline, CSS)
``workbook.report.page``'s; absent values are worded by ``workbook.report.wording`` (one
wording per fact; an empty table is a sentence). Images are ``data:`` URIs. The page loads
nothing from the network. Not here: running anything, judging a run (the verdicts are
``workbook.run.diagnose``'s, read from ``verdict.json``).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import os

import pandas as pd

from workbook.report import constraints as constraints_section
from workbook.report import grid, tokens, wording
from workbook.report.finding import (_count_line, _n_requests, cause_text,  # noqa: F401
                                     chain_text, finding, guard_runs, repairs, stage_of,
                                     terminal_lines, where_text)
from workbook.report.page import CSS, Page, _link, offline_init  # noqa: F401
from workbook.report.runs import (SPEC_KEYS, Batch, NoRuns, Run, _n_diff,  # noqa: F401
                                  _same_batch, _verdict, judged_requests, load_batch,
                                  nearest_honoured, verdict_of)
from workbook.report.wording import DASH, NOT_RECORDED  # noqa: F401  (DASH: the tables' "not applicable")

MAX_VIOLATIONS = 12
CONTEXT_AFTER = 3


def _finding_html(f: dict) -> str:
    klass = " alarm" if f["alarm"] else " warn" if f["warn"] else ""
    out = [f'<section class="finding{klass}">',
           f'<p class="headline">{html.escape(f["headline"])}</p>']
    for pb in f["batches"]:
        b: Batch = pb["batch"]
        cats = pb["cats"]
        state = "" if b.finished and b.manifest.get("status") != "interrupted" else (
            f' <span class="tag bad">{html.escape(str(b.manifest.get("status") or "unfinished"))}'
            "</span>")
        out.append(f"<div class=\"fb\"><h3>{html.escape(b.hardware)} — vLLM {html.escape(b.vllm)}"
                   f" on {html.escape(b.device)}, batch {html.escape(b.run_id)}{state}</h3><ul>")
        labels = {"healthy": "without a fault", "fault": "with an injected fault, guard off",
                  "guard": "with the guard on"}
        for k in ("healthy", "fault", "guard"):
            if cats[k]:
                ok, n = _n_requests(cats[k])
                out.append(f"<li><b>{len(cats[k])} run{'' if len(cats[k]) == 1 else 's'} "
                           f"{labels[k]}</b>: "
                           f"{html.escape(_count_line(cats[k]))} "
                           f"<span class=\"note\">({ok} of {n} requests judged honoured the "
                           "budget)</span></li>")
        out.append("</ul>")
        if pb.get("state"):
            out.append(f'<p class="bad">{html.escape(pb["state"])}</p>')
        if pb["violated"]:
            out.append('<ol class="viol">')
            for v in pb["violated"]:
                r: Run = v["run"]
                fault = (f"fault {v['fault']} injected" if v["fault"] != "none"
                         else '<b class="bad">no fault injected</b>')
                chain = (f'<br><span class="chain">{html.escape(v["chain"])}</span>'
                         if v["chain"] else "")
                anchor = f"v-{_slug(r.label)}"
                out.append(
                    f'<li><a href="#{anchor}"><b>{html.escape(r.name)}</b></a> ({fault}): '
                    f'<span class="stage">{html.escape(v["stage"] or "stage not named")}</span> → '
                    f'<span class="cause">{html.escape(v["cause"])}</span> → '
                    f'{html.escape(v["where"])}. '
                    f'<span class="{"ok" if v["fixed"] else "note"}">{html.escape(v["guard"])}'
                    f"</span>{chain}</li>")
            out.append("</ol>")
        if pb.get("guard"):
            out.append('<ul class="guard">')
            for r, said in pb["guard"]:
                out.append(f"<li><b>{html.escape(r.name)}</b> (guard on): {html.escape(said)}"
                           "</li>")
            out.append("</ul>")
        for r in pb["not_ok"]:
            fl = r.row.get("failure") or {}
            out.append(f'<p class="bad">{html.escape(r.name)}: {html.escape(str(r.row.get("status")))}'
                       f" — {html.escape(str(fl.get('ename') or ''))}: "
                       f"{html.escape(str(fl.get('evalue') or '')[:200])}</p>")
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


# ---------------------------------------------------------------- tables

def batches_table(batches: list[Batch]) -> pd.DataFrame:
    rows = []
    for b in batches:
        sw = b.environment.get("software") or {}
        m = b.manifest
        commit = sw.get("vllm_commit") or next(
            ((r.data.get("effective") or {}).get("vllm_commit") for r in b.runs
             if (r.data.get("effective") or {}).get("vllm_commit")), None)
        commit = commit or NOT_RECORDED
        rows.append({"hardware": m.get("hardware"), "run_id": m.get("run_id"),
                     "environment": m.get("environment_file"),
                     "status": m.get("status") if b.finished else
                     f"{m.get('status') or 'unknown'} (unfinished: no SHA256SUMS)",
                     "runs": f"{len(b.runs)} of {len(m.get('planned') or b.runs)}",
                     "started": m.get("started"), "finished": m.get("finished"),
                     "vllm": b.vllm, "vllm_commit": commit, "torch": sw.get("torch"),
                     "device": b.device,
                     "workbook_commit": ((m.get("workbook_git") or {}).get("commit") or "")[:12],
                     "folder": b.folder})
    return pd.DataFrame(rows)


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
        fv = v.get("first_violation") or {}
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
            "status": r.row.get("status"), "verdict": v.get("verdict"),
            "cause": cause_text(v) if v.get("hypothesis") else None,
            "first violation": (f"step {wording.value_text(fv.get('step'), 'not located')} · "
                                f"row {wording.value_text(fv.get('row'), 'not located')} · "
                                f"{fv.get('kind') or 'missing'}" if fv else None),
            "requests honoured": (f"{sum(q['honored'] is True for q in reqs)} of "
                                  f"{sum(q['honored'] is not None for q in reqs)} judged"
                                  if reqs else None),
            "configuration": " · ".join(x for x in conf if x),
            "fault": r.fault, "guard": "on" if r.guard else "off",
            "outcome (as the server reports it)": outcome,
            "checks": _checks_summary(r.data.get("checks") or {}) or None,
            "wall s": None if r.row.get("wall_s") is None else round(r.row["wall_s"]),
            "notebook": _link(r.notebook_link, "notebook")})
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


# effective-configuration keys whose None is a reading, not a gap: the engine was built without
# speculative decoding (``workbook.vllm.effective`` sets them from vLLM's speculative_config)
NONE_MEANS = {"spec_method": "none (no speculative decoding)",
              "speculator_class": "none (no speculative decoding)",
              "rejection_sampler_class": "none (no speculative decoding)"}


def _short(v, limit: int = 90, key: str | None = None) -> str:
    if wording.absent(v):
        return NONE_MEANS.get(key, NOT_RECORDED)
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def effective_tables(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(what differs between runs: a row per run; what every run shares: key, value)."""
    eff = {r.label: {k: v for k, v in (r.data.get("effective") or {}).items()
                     if k not in ("log_lines",)} for r in runs if r.data.get("effective")}
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


# ---------------------------------------------------------------- divergence

def pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Run pairs (A, B) of one batch worth comparing, A the suspect: every violated run with
    its nearest honoured run (its guarded twin first); else, the first run with speculative
    decoding and its twin without; else the first two finished runs."""
    done = [r for r in runs if r.outcome or r.verdict.get("requests")]
    found: list[tuple[Run, Run]] = []
    for a in done:
        if _verdict(a) == "violated":
            b = nearest_honoured(a, done)
            if b is not None:
                found.append((a, b))
    if found:
        return found
    for a in done:
        if a.config.get("spec_method", "none") == "none":
            continue
        twins = [b for b in done if b.config.get("spec_method") == "none" and _same_batch(a, b)
                 and _n_diff(a.config, b.config, ignore=SPEC_KEYS) == 0]
        if twins:
            return [(a, twins[0])]
    return [(done[0], done[1])] if len(done) >= 2 else []


def _focus_request(run: Run) -> int:
    """Index (0-based) of the request to compare: the first violated one, else the first."""
    reqs = judged_requests(run)
    return next((i for i, q in enumerate(reqs) if q["honored"] is False), 0)


def emitted_steps(run: Run, index: int | None = None) -> pd.DataFrame:
    """Per output position of request ``index`` (default: the focus request): step, path,
    forced, emitted token, from the trace (else just the tokens)."""
    reqs = judged_requests(run)
    index = _focus_request(run) if index is None else index
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
    index = _focus_request(a)
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


# ---------------------------------------------------------------- plots

def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_end_index(runs: list[Run]) -> str | None:
    """Every request of every run: where ``</think>`` came relative to where the budget put it
    (0 = exactly there). One line per run; violated requests in red, "never" at the right."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    data = [(r, judged_requests(r)) for r in runs]
    data = [(r, q) for r, q in data if q]
    if not data:
        return None
    offsets = [(q["actual"] - q["expected"]) for _, qs in data for q in qs
               if q["actual"] is not None and q["expected"] is not None]
    far = max([abs(o) for o in offsets] + [2]) + 2
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(data) + 1.4))
    for y, (r, qs) in enumerate(data):
        groups: dict[tuple, int] = {}
        for q in qs:
            if q["expected"] is None:
                x, kind = None, "none"
            elif q["actual"] is None:
                x, kind = far, "never"
            else:
                x, kind = q["actual"] - q["expected"], "ok" if q["honored"] else "bad"
            if q["honored"] is False and kind == "ok":
                kind = "bad"
            if x is not None:
                groups[(x, kind)] = groups.get((x, kind), 0) + 1
        for (x, kind), n in groups.items():
            color = {"ok": "tab:green", "bad": "tab:red", "never": "tab:red"}[kind]
            ax.scatter([x], [y], s=30 + 12 * min(n, 12), color=color,
                       marker="o" if kind == "ok" else "X", zorder=3)
            if n > 1:
                ax.annotate(f"×{n}", (x, y), xytext=(6, -3), textcoords="offset points",
                            fontsize=7)
        ok = sum(q["honored"] is True for q in qs)
        ax.annotate(f"{ok}/{len(qs)}", (1.0, y), xycoords=("axes fraction", "data"),
                    xytext=(6, -3), textcoords="offset points", fontsize=8,
                    color="tab:green" if ok == len(qs) else "tab:red")
    ax.axvline(0, color="tab:green", alpha=.4)
    ax.set_yticks(range(len(data)), [r.short for r, _ in data], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min([0] + offsets) - 1, far + 1)
    ticks = [t for t in ax.get_xticks() if t < far - 0.5 and t == int(t)]
    ax.set_xticks(ticks + [far], [str(int(t)) for t in ticks] + ["never"])
    ax.set_xlabel("output index of </think> minus the index the budget puts it at "
                  "(0: exact; every request of every run)")
    ax.grid(axis="x", alpha=.3)
    ax.set_title("Where </think> came (green: honoured, red X: violated; right: requests "
                 "honoured)", fontsize=10)
    return png(fig)


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


def plot_timings(runs: list[Run]) -> str | None:
    plt = _plt()
    data = [(r.short, time_parts(r), r.row.get("wall_s") or 0.0) for r in runs]
    data = [d for d in data if d[1]]
    if not data:
        return None
    labels = list(dict.fromkeys(lab for d in data for lab, _ in d[1]))
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(data) + 1.8))
    left = [0.0] * len(data)
    for lab in labels:
        vals = [dict(d[1]).get(lab, 0.0) for d in data]
        ax.barh(range(len(data)), vals, left=left, label=lab)
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([d[2] for d in data], range(len(data)), marker="x", color="k",
               label="run wall time")
    ax.set_yticks(range(len(data)), [d[0] for d in data], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=7)
    return png(fig)


def timings_table(runs: list[Run]) -> pd.DataFrame:
    """The time chart's numbers: a row per run, a column per part, and the wall time."""
    rows = []
    for r in runs:
        parts = time_parts(r)
        if parts:
            rows.append({"run": r.short, **{k: round(v, 1) for k, v in parts},
                         "wall time": round(float(r.row.get("wall_s") or 0.0), 1)})
    return pd.DataFrame(rows).fillna("—") if rows else pd.DataFrame()


# ---------------------------------------------------------------- HTML

def _violations(page: Page, runs: list[Run]) -> None:
    page.h(2, "Violations: the step × row picture", "violations")
    bad = [r for r in runs if _verdict(r) == "violated"]
    if not bad:
        page.p("No run violated the budget: nothing to show here.", "empty")
        return
    page.p("For each violated run, the first violated request: one column per engine step, "
           "one row per logits row (row 0 the target, row j the j-th draft); the tokens are "
           "decoded. Hover a cell for its details; the table under it is the violating step, "
           "with the </think> logit before and after the budget's bias.", "note")
    for r in bad[:MAX_VIOLATIONS]:
        v = r.verdict
        reqs = judged_requests(r)
        fv = v.get("first_violation") or {}
        focus = _focus_request(r)
        req = reqs[focus] if reqs else {}
        page.raw('<div class="viol-block">')
        page.h(3, f"{r.short} — {stage_of(v.get('hypothesis')) or 'stage not named'} → {cause_text(v)}",
               f"v-{_slug(r.label)}")
        chain = chain_text(v)
        text = where_text(r) + "." + (f" Chain: {chain}." if chain else "") + \
            (f" Diagnosis: {v.get('reason')}." if v.get("reason") else "")
        page.p(text)
        n_bad = sum(q["honored"] is False for q in reqs)
        if n_bad > 1:
            said = ", ".join(f"{wording.budget_text(q['budget'])}"
                             + (f": {q['kind']}" if q.get("kind") else "")
                             for q in reqs if q["honored"] is False)
            page.p(f"{n_bad} of {len(reqs)} requests of this run violated the budget "
                   f"(budgets {said}); the first is drawn.", "note")
        if r.notebook_link:
            page.raw(f'<p class="note">Executed notebook: {_link(r.notebook_link, "open")}</p>')
        g = grid.cells(r.frames, req.get("req_id")) if r.frames and req else pd.DataFrame()
        if g.empty:
            page.p("(no trace for this run: the tokens as the client saw them)", "empty")
        else:
            gr = {"expected_end_index": req.get("expected"), "honored": req.get("honored")}
            steps = sorted(int(s) for s in g["step"].unique())
            focus_step = fv.get("step") if fv.get("req_id") == req.get("req_id") else \
                grid.violation_step(g, gr)
            win = grid.window_around(steps, focus_step, 14)
            if len(win) < len(steps):
                page.p(f"Steps {win[0]}–{win[-1]} of {len(steps)} shown (steps {steps[0]}–"
                       f"{steps[-1]} traced; the window starts a few steps before the "
                       "violating one); the executed notebook's step explorer shows every "
                       "step.", "note")
            page.raw(grid.grid_html(g, gr, r.decode, r.end_ids, steps=win))
            if focus_step is not None:
                page.plain(grid.rows_at_step(g, int(focus_step), r.decode),
                           f"step {focus_step}: every logits row of the request",
                           empty=f"The trace holds no logits row of this request at step "
                                 f"{focus_step}.")
        other = nearest_honoured(r, runs)
        if other is not None:
            first, table, index = divergence(r, other)
            page.p(f"Against {other.short} (request {index + 1}): "
                   + ("identical emitted tokens" if first is None
                      else f"first divergence at output #{first}"), "note")
            page.plain(table, f"A = {r.short}, B = {other.short}",
                       empty="Neither run emitted a token for this request.")
        page.raw("</div>")
    if len(bad) > MAX_VIOLATIONS:
        page.p(f"… and {len(bad) - MAX_VIOLATIONS} more violated runs (see the verdict "
               "table).", "note")


def _guard(page: Page, runs: list[Run]) -> None:
    """Per run with the guard on: what it did, and every repair of its own state it logged."""
    found = guard_runs(runs)
    if not found:
        return
    page.h(2, "What the guard did", "guard")
    page.p("Per run with the guard on: tokens it replaced (a due </think> that vLLM did not "
           "commit) and fields of its own device state it found differing from the host's "
           "truth and repaired; every repair is listed (the trace's guard table).", "note")
    for r, said in found:
        page.h(3, r.short)
        page.p(said[0].upper() + said[1:] + ".")
        recs = repairs(r)
        if recs:
            page.plain(pd.DataFrame(recs).map(
                lambda x: wording.value_text(x) if not isinstance(x, str) else x),
                f"every repair the guard logged in {r.name}")


def _divergences(page: Page, runs: list[Run]) -> None:
    """First divergence between runs when nothing was violated (MTP vs no speculation)."""
    if any(_verdict(r) == "violated" for r in runs):
        return
    found = pairs(runs)
    page.h(2, "First divergence between runs", "divergence")
    if not found:
        page.p("(fewer than two finished runs)", "empty")
    for a, b in found:
        first, table, index = divergence(a, b)
        page.h(3, f"A = {a.short}  vs  B = {b.short} (request {index + 1})")
        page.p("identical emitted tokens" if first is None
               else f"first divergence at output #{first}", "note")
        page.plain(table, "emitted tokens step by step (path, forced from the trace)",
                   empty="Neither run emitted a token for this request.")


def build(batches: list[Batch], base: str | None = None, grids: list[dict] | None = None,
          grid_source: str | None = None) -> str:
    """The page over ``batches``; ``base``: the report's folder (for relative links);
    ``grids``: constraints grids (``constraints_section.load``) — a section when any;
    ``grid_source``: a sentence saying where they come from when not from these runs."""
    runs = [r for b in batches for r in b.runs]
    if not runs and grids:  # a constraints grid's run folder (workbook.run.grid): its grid
        page = Page(constraints_section.TITLE)
        page.h(1, page.title)
        page.p(f"Generated {dt.datetime.now().astimezone().isoformat(timespec='seconds')} from "
               f"{len(grids)} constraints grid(s).", "note")
        page.raw(constraints_section.finding_html(grids))
        page.raw(constraints_section.section_html(grids))
        return page.render()
    if not runs:
        raise NoRuns("no runs in " + ", ".join(b.folder for b in batches))
    for r in runs:
        r.notebook_link = _notebook_link(r, base)
    page = Page("vLLM #54906 — thinking_token_budget investigation report")
    page.h(1, page.title)
    page.p(f"Generated {dt.datetime.now().astimezone().isoformat(timespec='seconds')} from "
           f"{len(batches)} batch folder(s), {len(runs)} run(s).", "note")
    page.raw(_finding_html(finding(batches)))
    if grids:
        page.raw(constraints_section.finding_html(grids))
        if grid_source:
            page.p(grid_source, "note")
    page.raw('<nav class="toc"><a href="#verdicts">Verdicts</a><a href="#violations">'
             'Violations</a><a href="#where">Where &lt;/think&gt; came</a><a href="#failures">'
             'Failures</a><a href="#time">Time</a><a href="#folders">Run folders</a>'
             '<a href="#effective">Effective configuration</a>'
             + ('<a href="#constraints">Constraints</a>' if grids else "") + '</nav>')
    page.h(2, "Verdicts", "verdicts")
    vt = verdict_table(runs)
    page.plain(verdict_matrix(vt), "verdict per run name and batch (a run that did not "
                                   "finish shows its status)",
               empty="No run recorded a verdict.")
    page.table(vt, "every run: verdict, cause, requests honoured, configuration, outcome as "
                   "the server reports it")
    _violations(page, runs)
    _guard(page, runs)
    _divergences(page, runs)
    page.h(2, "Where </think> came", "where")
    page.image(plot_end_index(runs), "where </think> came, every request")
    page.h(2, "Failures", "failures")
    ft = failures_table(runs)
    if ft.empty:
        page.p("Every run finished.", "empty")
    else:
        page.plain(ft, "runs that did not finish (interrupted: stopped by a signal)")
    page.h(2, "Time per run", "time")
    page.image(plot_timings(runs), "timings")
    page.plain(timings_table(runs), "seconds per part (every part of a run's wall time)",
               empty="No run recorded its timings.")
    page.h(2, "Run folders", "folders")
    page.plain(batches_table(batches), empty="No batch folder.")
    page.h(2, "Effective configuration", "effective")
    for b in batches:
        differ, common = effective_tables(b.runs)
        page.h(3, f"{b.hardware} {b.run_id}: read from the live engine")
        if differ.empty and common.empty:
            page.p("No run of this batch recorded its effective configuration "
                   "(effective.json): none reached a live engine.", "empty")
            continue
        page.plain(differ, "what differs between the runs",
                   empty="Every run of this batch ran the same effective configuration.")
        page.plain(common, "the same in every run",
                   empty="No setting is the same in every run.")
    if grids:
        page.raw(constraints_section.section_html(grids))
        if grid_source:
            page.p(grid_source, "note")
    for b in batches:
        ce = (b.environment.get("collect_env") or {}).get("output")
        if ce:
            page.pre(ce, f"vllm collect-env — {b.hardware} {b.run_id}")
    return page.render()


def _notebook_link(run: Run, base: str | None) -> str | None:
    """The run's executed notebook as HTML (rendered by the batch, else next to the report)."""
    nb = run.row.get("executed_notebook")
    if not nb:
        return None
    ipynb = os.path.join(run.folder, nb)
    page = os.path.splitext(ipynb)[0] + ".html"
    if not os.path.exists(page) and os.path.exists(ipynb) and base:
        from workbook.batch import nbhtml

        page = os.path.join(base, "notebooks", f"{run.hardware}-{run.run_id}-{run.name}.html")
        if not os.path.exists(page):
            try:
                nbhtml.render(ipynb, page)
            except Exception:
                return None
    if not os.path.exists(page):
        return None
    return os.path.relpath(page, base) if base else page


def default_path(out: str = "outputs") -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return os.path.join(out, "reports", f"report-{stamp}.html")


REPO_OUTPUTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "outputs")


def committed_grids(root: str = REPO_OUTPUTS) -> tuple[list[str], str | None]:
    """The constraints grids committed with the workbook (``outputs/<hardware>/constraints-*``)
    and the sentence that says so; ([], None) when there are none."""
    import glob

    found = sorted(glob.glob(os.path.join(root, "*", "constraints-*", constraints_section.GRID)))
    if not found:
        return [], None
    rel = sorted({os.path.relpath(os.path.dirname(os.path.dirname(p)), os.path.dirname(root))
                  for p in found})
    return found, (f"The constraints grids shown are the ones committed with the workbook "
                   f"({len(found)} grid(s) under {', '.join(r + '/constraints-*' for r in rel)}),"
                   " not this run's: `.venv/bin/workbook run constraints` runs a grid of your "
                   "own (docs/constraints.md).")


def write(run_dirs: list[str], path: str, grid_paths: list[str] | None = None,
          committed: bool = False) -> str:
    """Build the report over ``run_dirs`` and write it to ``path``; return the path.
    ``grid_paths``: where to look for constraints ``grid.json`` files (default: the run
    folders themselves) — the "Constraints under speculative decoding" section shows them;
    ``committed``: when those hold none, show the grids committed with the workbook (said so
    on the page: ``workbook run``'s first report).

    Raises ``NoRuns`` when the folders hold no run (nothing is written then)."""
    batches = [load_batch(d) for d in run_dirs]
    base = os.path.dirname(os.path.abspath(path))
    grids = constraints_section.load(list(run_dirs if grid_paths is None else grid_paths))
    source = None
    if not grids and committed:
        paths, source = committed_grids()
        grids = constraints_section.load(paths)
    text = build(batches, base, grids, source if grids else None)
    os.makedirs(base, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path
