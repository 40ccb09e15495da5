"""The steps × rows picture of one request: what every logits row of every step did.

Columns are engine steps, rows are the logits rows of a step (row 0 the target position,
row j the j-th draft). Each cell shows the token the row emitted (decoded), or, struck
through, the token it sampled but did not emit; it is marked **forced** (the budget's bias set
``</think>``'s logit after ``ThinkingBudgetState.apply``), **accepted** (a draft the rejection
sampler kept), ``</think>`` emitted, and the output index ``#i`` of what it emitted. The cell
where the budget put ``</think>`` is outlined: green when it came there, red when it did not
(the violation). Every cell carries its details (end-token logit before / after the bias and in
the logits handed to sampling, the step's gate, fast path, host / device budget, kernels).

- ``requests_of(frames, verdict)``: the traced requests, judged (from ``verdict.json``).
- ``cells(frames, req_id)``: one record per (step, row) of a request.
- ``grid_html(...)``: a static HTML table (the report, exported notebooks); ``CSS`` its style.
- ``explorer(...)``: the same grid as ipywidgets for JupyterLab — a window of steps moved with
  buttons or a slider, an overview strip of every step, the selected cell's details — readable
  for a 32-token answer and for a 500-step trace.

Not here: judging (``workbook.run.budget.diagnose``); this module only draws what the trace holds.
"""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from workbook.core import budget
from workbook.report import tokens

FORCED_MIN = budget.FORCED_LOGIT  # an end logit at least this large was set by the budget's bias
STEP_KEYS = ("path", "phase", "num_drafts", "gate", "fast_path", "budget_host", "budget_device",
             "use_thinking_budget", "enabled", "apply_called", "kernels_launched",
             "reasoning_count", "last_start", "last_end", "num_rejected")

CSS = """
.wbg-wrap{overflow-x:auto;max-width:100%}
table.wbg{border-collapse:separate;border-spacing:2px;font:12px/1.2 ui-monospace,Menlo,Consolas,monospace}
table.wbg th{font-weight:600;color:#333;background:#f3f3f3;padding:2px 4px;text-align:center;white-space:nowrap}
table.wbg th.wbg-rh{text-align:right}
table.wbg td{min-width:3.6em;max-width:6.5em;padding:2px 3px;text-align:center;border:1px solid #d0d0d0;
 background:#fff;vertical-align:top;position:relative;overflow:hidden}
.wbg-t{display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.wbg-i{display:block;font-size:10px;color:#777}
td.wbg-none{background:repeating-linear-gradient(45deg,#fafafa,#fafafa 4px,#f0f0f0 4px,#f0f0f0 8px);border-color:#eee}
td.wbg-off .wbg-t{color:#999;text-decoration:line-through}
td.wbg-nos .wbg-t{text-decoration:none}
td.wbg-off{background:#f6f6f6}
td.wbg-forced{background:#d8f0d8;padding-left:9px}
td.wbg-forced:before{content:"F";position:absolute;left:1px;top:0;font-size:9px;color:#1a7f37;font-weight:700}
td.wbg-acc{box-shadow:inset 0 -3px 0 #3b7dd8}
td.wbg-end .wbg-t{font-weight:700;color:#0b6e2e}
td.wbg-due-ok{outline:2px solid #2ca02c;outline-offset:-1px}
td.wbg-due-bad{outline:3px solid #d62728;outline-offset:-2px}
th.wbg-warn{background:#fde2e1;color:#a01010}
.wbg-legend{font:12px system-ui,sans-serif;margin:.3em 0}
.wbg-legend span.k{display:inline-block;min-width:1.8em;padding:0 3px;margin:0 2px 0 10px;border:1px solid #d0d0d0;text-align:center;position:relative}
table.wbg-d{border-collapse:collapse;font:12px system-ui,sans-serif}
table.wbg-d td,table.wbg-d th{border:1px solid #ddd;padding:2px 6px;text-align:left}
"""


# ---------------------------------------------------------------- data

def _py(v):
    if v is None:
        return None
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def requests_of(frames: dict, verdict: dict | None = None) -> list[dict]:
    """Traced requests in registration order: req_id, budget, expected index, honored, output.

    The judgement is the diagnosis' (``verdict["requests"]``); without it, the registrations
    (budget only). ``index`` is the request's position in the run (1-based)."""
    found = [dict(r) for r in (verdict or {}).get("requests") or []]
    if not found:
        regs = frames.get("registrations")
        if regs is not None and len(regs):
            found = [{"req_id": r["req_id"], "budget": _py(r.get("budget_param")),
                      "expected_end_index": None, "honored": None, "output": []}
                     for r in regs.to_dict("records")]
    for i, r in enumerate(found):
        r["index"] = i + 1
    return found


def cells(frames: dict, req_id) -> pd.DataFrame:
    """One record per (step, logits row) of ``req_id``: the row and its request-step state."""
    rows = frames.get("rows")
    if rows is None or rows.empty:
        return pd.DataFrame()
    sel = rows[rows["req_id"] == req_id].sort_values(["step", "local_pos"])
    sel = sel.drop_duplicates(["step", "local_pos"]).reset_index(drop=True)
    reqs = frames.get("requests")
    if reqs is not None and not reqs.empty:
        keep = ["step"] + [k for k in STEP_KEYS if k in reqs.columns]
        st = reqs[reqs["req_id"] == req_id][keep].drop_duplicates("step")
        sel = sel.merge(st, on="step", how="left")
    emitted = sel["emitted"].map(lambda v: bool(v) if _py(v) is not None else False)
    sel["emitted"] = emitted
    idx = emitted.cumsum() - 1
    sel["output_index"] = pd.Series([int(i) if e else None for i, e in zip(idx, emitted)],
                                    dtype=object, index=sel.index)
    return sel


def _is_end(tok, end_ids) -> bool:
    t = _py(tok)
    return t is not None and int(t) in end_ids


def _forced(row) -> bool:
    v = _py(row.get("end_logit_after_apply"))
    return bool(_py(row.get("forced"))) or (v is not None and v >= FORCED_MIN)


def step_warning(st: dict) -> str | None:
    """What about a request-step's budget state would explain a lost budget (None: nothing)."""
    if st.get("enabled") is False:
        return "ThinkingBudgetState disabled"
    if st.get("use_thinking_budget") is False:
        return "budget not registered"
    if st.get("gate") is False or st.get("fast_path") is True:
        return f"gate {st.get('gate')}, fast path {st.get('fast_path')}"
    bh, bd = _py(st.get("budget_host")), _py(st.get("budget_device"))
    if bh is not None and bd is not None and bh != bd:
        return f"device budget {bd} ≠ host {bh}"
    if st.get("apply_called") and st.get("use_thinking_budget") and \
            st.get("kernels_launched") is False:
        return "apply launched no kernel"
    return None


def violation_step(grid: pd.DataFrame, req: dict) -> int | None:
    """The step holding the output index where the budget put ``</think>``."""
    e = req.get("expected_end_index")
    if e is None or grid.empty:
        return None
    hit = grid[grid["output_index"] == e]
    return int(hit["step"].iloc[0]) if len(hit) else None


def window_around(steps: list[int], focus: int | None, size: int, before: int = 3) -> list[int]:
    if not steps:
        return []
    i = steps.index(focus) if focus in steps else 0
    start = max(0, min(i - before, len(steps) - size))
    return steps[start:start + size]


# ---------------------------------------------------------------- formatting

def num(v) -> str:
    v = _py(v)
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int,)) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e6):
        return str(int(v))
    if isinstance(v, float):
        if math.isinf(v):
            return "+inf" if v > 0 else "−inf"
        if abs(v) >= 1e6:
            return f"{v:+.0e}".replace("e+0", "e").replace("e-0", "e-")
        return f"{v:.3g}"
    return str(v)


def _flag(v) -> str:
    v = _py(v)
    return "—" if v is None else ("yes" if v else "no")


def cell_state(row: dict, req: dict, end_ids) -> dict[str, Any]:
    """Classes and texts of one cell (shared by the HTML grid and the widget explorer)."""
    emitted = bool(row.get("emitted"))
    tok = _py(row.get("emitted_token")) if emitted else _py(row.get("sampled_vllm"))
    forced = _forced(row)
    accepted = bool(_py(row.get("draft_accepted"))) and int(row.get("local_pos") or 0) > 0
    classes = ["wbg-c"]
    if not emitted:
        classes.append("wbg-off")
        if tok is None:
            classes.append("wbg-nos")
    if forced:
        classes.append("wbg-forced")
    if accepted:
        classes.append("wbg-acc")
    if emitted and _is_end(tok, end_ids):
        classes.append("wbg-end")
    due = req.get("expected_end_index") is not None and emitted and \
        row.get("output_index") == req.get("expected_end_index")
    if due:
        classes.append("wbg-due-ok" if _is_end(tok, end_ids) else "wbg-due-bad")
    return {"token": tok, "classes": classes, "emitted": emitted, "forced": forced,
            "accepted": accepted, "due": due,
            "due_ok": due and _is_end(tok, end_ids)}


def details_rows(row: dict, decode: tokens.Decode) -> list[tuple[str, str]]:
    """The selected cell, as (field, value) pairs."""
    lp = int(row.get("local_pos") or 0)
    return [
        ("step · row", f"step {num(row.get('step'))}, logits row {num(row.get('row'))} "
                       f"(local_pos {lp}: {'target' if lp == 0 else f'draft {lp}'})"),
        ("path", str(row.get("path") or "—")),
        ("input token (draft for local_pos > 0)", tokens.label(decode, row.get("input_token"))),
        ("</think> logit: raw → before apply", f"{num(row.get('end_logit_raw'))} → "
                                               f"{num(row.get('end_logit_before_apply'))}"),
        ("</think> logit: after the budget's bias",
         f"{num(row.get('end_logit_after_apply'))} (forced: {_flag(row.get('forced'))})"),
        ("</think> logit: handed to sampling",
         f"{num(row.get('end_logit_final'))} (forced: {_flag(row.get('forced_final'))})"),
        ("sampled by vLLM", tokens.label(decode, row.get("sampled_vllm"))),
        ("emitted", f"{tokens.label(decode, row.get('emitted_token'))} — "
                    f"{'output #' + num(row.get('output_index')) if row.get('emitted') else 'not emitted'}"),
        ("draft accepted", _flag(row.get("draft_accepted"))),
        ("request-step: gate / fast path", f"{_flag(row.get('gate'))} / "
                                           f"{_flag(row.get('fast_path'))}"),
        ("budget host / device", f"{num(row.get('budget_host'))} / "
                                 f"{num(row.get('budget_device'))}"),
        ("apply called / kernels launched", f"{_flag(row.get('apply_called'))} / "
                                            f"{_flag(row.get('kernels_launched'))}"),
        ("reasoning tokens before the step", num(row.get("reasoning_count"))),
    ]


def details_html(row: dict | None, decode: tokens.Decode) -> str:
    if row is None:
        return "<i>select a cell</i>"
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in details_rows(row, decode))
    return f'<table class="wbg-d">{body}</table>'


def legend_html() -> str:
    return ('<div class="wbg-legend">'
            '<span class="k" style="background:#fff">tok</span>emitted'
            '<span class="k" style="background:#f6f6f6;color:#999;text-decoration:line-through">'
            'tok</span>sampled, not emitted'
            '<span class="k" style="background:#f6f6f6;color:#999">–</span>not sampled (after a'
            ' rejected draft)'
            '<span class="k" style="background:#d8f0d8">F</span>forced (&lt;/think&gt; logit set by'
            ' the budget)'
            '<span class="k" style="box-shadow:inset 0 -3px 0 #3b7dd8">tok</span>draft accepted'
            '<span class="k" style="font-weight:700;color:#0b6e2e">&lt;/think&gt;</span>end emitted'
            '<span class="k" style="outline:2px solid #2ca02c">ok</span>budget due here, honoured'
            '<span class="k" style="outline:3px solid #d62728">✗</span>budget due here, violated'
            '<span class="k">#i</span>output index</div>')


def grid_html(grid: pd.DataFrame, req: dict, decode: tokens.Decode, end_ids, *,
              steps: list[int] | None = None, legend: bool = True,
              style: bool = False) -> str:
    """The static grid of one request over ``steps`` (default: all of its steps)."""
    if grid.empty:
        return '<p class="empty">(no logits rows traced for this request)</p>'
    all_steps = sorted(int(s) for s in grid["step"].unique())
    steps = steps if steps is not None else all_steps
    sub = grid[grid["step"].isin(steps)]
    n_rows = int(grid["local_pos"].max()) + 1
    by = {(int(r["step"]), int(r["local_pos"])): r for r in sub.to_dict("records")}
    st = {int(r["step"]): r for r in sub.drop_duplicates("step").to_dict("records")}
    head = ['<tr><th class="wbg-rh">step</th>']
    head2 = ['<tr><th class="wbg-rh">path · state</th>']
    for s in steps:
        warn = step_warning(st.get(s, {}))
        p = str(st.get(s, {}).get("path") or "")
        short = {"Sampler": "S", "RejectionSampler": "R"}.get(p, p[:3])
        cls = ' class="wbg-warn"' if warn else ""
        title = html.escape(f"{p}" + (f" — {warn}" if warn else ""))
        head.append(f"<th{cls} title=\"{title}\">{s}</th>")
        head2.append(f"<th{cls} title=\"{title}\">{html.escape(short)}{' ⚠' if warn else ''}</th>")
    body = []
    for lp in range(n_rows):
        name = "row 0 · target" if lp == 0 else f"row {lp} · draft {lp}"
        tds = [f'<th class="wbg-rh">{name}</th>']
        for s in steps:
            row = by.get((s, lp))
            if row is None:
                tds.append('<td class="wbg-none"></td>')
                continue
            c = cell_state(row, req, end_ids)
            text = tokens.show(decode(c["token"]), 9) if c["token"] is not None else "–"
            idx = f"#{row['output_index']}" if c["emitted"] else "&nbsp;"
            tip = "\n".join(f"{k}: {v}" for k, v in details_rows(row, decode))
            tds.append(f'<td class="{" ".join(c["classes"])}" title="{html.escape(tip)}">'
                       f'<span class="wbg-t">{html.escape(text)}</span>'
                       f'<span class="wbg-i">{idx}</span></td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    table = ('<div class="wbg-wrap"><table class="wbg">' + "".join(head) + "</tr>"
             + "".join(head2) + "</tr>" + "".join(body) + "</table></div>")
    out = (legend_html() if legend else "") + table
    return (f"<style>{CSS}</style>" + out) if style else out


def rows_at_step(grid: pd.DataFrame, step: int, decode: tokens.Decode) -> pd.DataFrame:
    """Every logits row of one step: tokens decoded, the end logit before/after the bias."""
    sub = grid[grid["step"] == step]
    out = []
    for r in sub.to_dict("records"):
        out.append({"row (local_pos)": f"{num(r.get('row'))} ({num(r.get('local_pos'))})",
                    "input / draft": tokens.label(decode, r.get("input_token")),
                    "</think> logit before bias": num(r.get("end_logit_before_apply")),
                    "after bias": num(r.get("end_logit_after_apply")),
                    "to sampling": num(r.get("end_logit_final")),
                    "forced": _flag(r.get("forced")),
                    "sampled": tokens.label(decode, r.get("sampled_vllm")),
                    "accepted": _flag(r.get("draft_accepted")),
                    "emitted": tokens.label(decode, r.get("emitted_token"))
                    if r.get("emitted") else "— (not emitted)",
                    "output #": num(r.get("output_index"))})
    return pd.DataFrame(out)


# ---------------------------------------------------------------- JupyterLab explorer

_COLORS = {"forced": "#d8f0d8", "off": "#f1f1f1", "plain": "#ffffff", "bad": "#fbd5d5"}


def overview_html(grid: pd.DataFrame, req: dict, window: list[int], end_ids,
                  width_px: int = 900) -> str:
    """Every step of the request as a thin block (several steps per block beyond 300 steps):
    red = the budget's step, violated; green = a row forced; blue = drafts accepted; grey =
    other. The current window is framed. Never wider than ``width_px``."""
    steps = sorted(int(s) for s in grid["step"].unique())
    if not steps:
        return ""
    bad = violation_step(grid, req) if req.get("honored") is False else None
    forced = set(grid[grid.apply(_forced, axis=1)]["step"].astype(int)) if len(grid) else set()
    acc = set(grid[grid["draft_accepted"].map(lambda v: bool(_py(v)))]["step"].astype(int)) \
        if "draft_accepted" in grid else set()
    per = math.ceil(len(steps) / 300)
    bins = [steps[i:i + per] for i in range(0, len(steps), per)]
    width = max(2, min(14, width_px // len(bins) - 1))
    lo, hi = (window[0], window[-1]) if window else (None, None)
    parts = []
    for b in bins:
        color = ("#d62728" if bad in b else "#2ca02c" if forced & set(b)
                 else "#3b7dd8" if acc & set(b) else "#c8c8c8")
        inside = lo is not None and any(lo <= s <= hi for s in b)
        title = f"step {b[0]}" + (f"–{b[-1]}" if len(b) > 1 else "")
        parts.append(f'<span title="{title}" style="display:inline-block;width:{width}px;'
                     f'height:14px;background:{color};margin-right:1px;'
                     f'opacity:{1 if inside else .45};border-top:3px solid '
                     f'{"#000" if inside else "transparent"}"></span>')
    return (f'<div class="wb-overview" style="line-height:0;white-space:nowrap;overflow:hidden;'
            f'max-width:{width_px}px">{"".join(parts)}</div>'
            f'<div style="font:11px system-ui;color:#555">steps {steps[0]}–{steps[-1]} '
            f'({len(steps)}{f", {per} per block" if per > 1 else ""}); window {lo}–{hi}; red: '
            'the budget\'s step, violated; green: a row forced; blue: drafts accepted</div>')


def explorer(frames: dict, verdict: dict | None, decode: tokens.Decode | None = None,
             end_ids=None, window: int = 12):
    """ipywidgets explorer over every traced request (JupyterLab)."""
    import ipywidgets as w

    decode = decode or tokens.decoder()
    end_ids = set(end_ids or budget.Markers.of((verdict or {}).get("markers")).end)
    reqs = requests_of(frames, verdict)
    if not reqs or frames.get("rows") is None or frames["rows"].empty:
        return w.HTML("<i>no logits rows traced</i>")

    def req_label(r):
        state = {True: "honoured", False: "VIOLATED", None: "not judged"}[r.get("honored")]
        return f"request {r['index']} · budget {r.get('budget')} · {state}"

    first_bad = next((r for r in reqs if r.get("honored") is False), reqs[0])
    pick = w.Dropdown(options=[(req_label(r), i) for i, r in enumerate(reqs)],
                      value=reqs.index(first_bad), description="request",
                      layout=w.Layout(width="420px"))
    size = w.Dropdown(options=[6, 12, 24], value=window if window in (6, 12, 24) else 12,
                      description="steps shown", style={"description_width": "initial"},
                      layout=w.Layout(width="180px"))
    start = w.IntSlider(description="first step", continuous_update=False,
                        layout=w.Layout(width="520px"))
    prev_b = w.Button(description="◀ earlier", layout=w.Layout(width="90px"))
    next_b = w.Button(description="later ▶", layout=w.Layout(width="90px"))
    jump_b = w.Button(description="go to the budget's step", layout=w.Layout(width="190px"))
    for b, cls in ((prev_b, "wb-prev"), (next_b, "wb-next"), (jump_b, "wb-jump")):
        b.add_class(cls)
    overview = w.HTML()
    details = w.HTML("<i>select a cell</i>")
    details.add_class("wb-details")
    status = w.HTML()
    status.add_class("wb-status")
    grid_box = w.GridBox(layout=w.Layout(grid_gap="2px", overflow="auto"))
    grid_box.add_class("wb-grid")
    state: dict[str, Any] = {"grid": None, "steps": [], "buttons": [], "heads": []}

    def load_request():
        r = reqs[pick.value]
        g = cells(frames, r["req_id"])
        state["grid"], state["req"] = g, r
        state["steps"] = sorted(int(s) for s in g["step"].unique()) if len(g) else []
        state["n_rows"] = int(g["local_pos"].max()) + 1 if len(g) else 1
        start.max = max(0, len(state["steps"]) - 1)
        focus = violation_step(g, r)
        win = window_around(state["steps"], focus, size.value)
        start.value = state["steps"].index(win[0]) if win else 0
        build_pool()
        render()

    def build_pool():
        n = max(1, min(size.value, len(state["steps"])))
        heads = [w.HTML("<b>step</b>")] + [w.HTML() for _ in range(n)]
        btns = []
        children = list(heads)
        for lp in range(state["n_rows"]):
            children.append(w.HTML(f"<b>row {lp}</b> · {'target' if lp == 0 else 'draft'}"))
            row_btns = []
            for j in range(n):
                b = w.Button(layout=w.Layout(width="auto", height="34px", padding="0 2px"))
                b.add_class("wb-cell")
                b.on_click(lambda _b, lp=lp, j=j: select(lp, j))
                row_btns.append(b)
                children.append(b)
            btns.append(row_btns)
        grid_box.layout.grid_template_columns = f"110px repeat({n}, minmax(60px, 110px))"
        grid_box.children = children
        state["buttons"], state["heads"] = btns, heads

    def visible() -> list[int]:
        i = start.value
        return state["steps"][i:i + size.value]

    def render(*_):
        g, r = state["grid"], state["req"]
        steps = visible()
        by = {(int(x["step"]), int(x["local_pos"])): x for x in
              g[g["step"].isin(steps)].to_dict("records")} if len(g) else {}
        st = {int(x["step"]): x for x in g.drop_duplicates("step").to_dict("records")}
        for j, head in enumerate(state["heads"][1:]):
            if j < len(steps):
                s = steps[j]
                warn = step_warning(st.get(s, {}))
                p = {"Sampler": "S", "RejectionSampler": "R"}.get(str(st[s].get("path")), "?")
                head.value = (f"<span title='{html.escape(warn or '')}' style='color:"
                              f"{'#a01010' if warn else '#333'}'><b>{s}</b> {p}"
                              f"{' ⚠' if warn else ''}</span>")
            else:
                head.value = ""
        for lp, row_btns in enumerate(state["buttons"]):
            for j, b in enumerate(row_btns):
                row = by.get((steps[j], lp)) if j < len(steps) else None
                if row is None:  # (an empty description would not clear the old text)
                    b.description, b.tooltip, b.disabled = "\u00a0", "", True
                    b.style.button_color = "#fafafa"
                    b.style.text_decoration = "none"
                    b.layout.border = "1px solid #eee"
                    continue
                c = cell_state(row, r, end_ids)
                text = tokens.show(decode(c["token"]), 8) if c["token"] is not None else "–"
                idx = f" #{row['output_index']}" if c["emitted"] else ""
                b.disabled = False
                b.description = ("F " if c["forced"] else "") + text + idx
                b.tooltip = "\n".join(f"{k}: {v}" for k, v in details_rows(row, decode))
                b.style.button_color = (_COLORS["forced"] if c["forced"] else
                                        _COLORS["off"] if not c["emitted"] else _COLORS["plain"])
                b.style.text_decoration = "none" if c["emitted"] or c["token"] is None \
                    else "line-through"
                b.style.font_weight = "bold" if "wbg-end" in c["classes"] else "normal"
                b.style.text_color = "#999" if not c["emitted"] else (
                    "#0b6e2e" if "wbg-end" in c["classes"] else "#111")
                b.layout.border = ("3px solid #d62728" if c["due"] and not c["due_ok"] else
                                   "2px solid #2ca02c" if c["due"] else "1px solid #ccc")
                b.layout.border_bottom = "4px solid #3b7dd8" if c["accepted"] else None
        overview.value = overview_html(g, r, steps, end_ids)
        status.value = (f"<span style='font:12px system-ui'>{html.escape(req_label(r))}; "
                        f"budget due at output #{r.get('expected_end_index')}; showing steps "
                        f"{steps[0] if steps else '—'}–{steps[-1] if steps else '—'} of "
                        f"{len(state['steps'])}</span>")

    def select(lp: int, j: int):
        steps = visible()
        if j >= len(steps):
            return
        g = state["grid"]
        hit = g[(g["step"] == steps[j]) & (g["local_pos"] == lp)]
        for row_btns in state["buttons"]:
            for b in row_btns:
                b.remove_class("wb-selected")
        state["buttons"][lp][j].add_class("wb-selected")
        details.value = details_html(hit.to_dict("records")[0] if len(hit) else None, decode)

    def move(delta: int):
        start.value = max(0, min(start.max, start.value + delta))

    prev_b.on_click(lambda _b: move(-max(1, size.value // 2)))
    next_b.on_click(lambda _b: move(max(1, size.value // 2)))

    def jump(_b=None):
        focus = violation_step(state["grid"], state["req"])
        win = window_around(state["steps"], focus, size.value)
        if win:
            start.value = state["steps"].index(win[0])

    jump_b.on_click(jump)
    start.observe(render, names="value")
    pick.observe(lambda _c: load_request(), names="value")
    size.observe(lambda _c: (build_pool(), render()), names="value")
    load_request()
    legend = w.HTML(f"<style>{CSS}.wb-cell{{font-family:ui-monospace,monospace;"
                    "font-size:12px}.wb-selected{box-shadow:0 0 0 3px #6a3d9a!important}</style>"
                    + legend_html())
    return w.VBox([w.HBox([pick, size]), w.HBox([prev_b, start, next_b, jump_b]), overview,
                   status, legend, grid_box, details])


def explorer_static(frames: dict, verdict: dict | None, decode: tokens.Decode | None = None,
                    end_ids=None, window: int = 16) -> str:
    """What ``explorer`` shows first, as HTML (kept by nbconvert's export)."""
    decode = decode or tokens.decoder()
    end_ids = set(end_ids or budget.Markers.of((verdict or {}).get("markers")).end)
    reqs = requests_of(frames, verdict)
    if not reqs:
        return "<i>no requests traced</i>"
    r = next((x for x in reqs if x.get("honored") is False), reqs[0])
    g = cells(frames, r["req_id"])
    steps = sorted(int(s) for s in g["step"].unique()) if len(g) else []
    win = window_around(steps, violation_step(g, r), window)
    head = (f"<p style='font:13px system-ui'>request {r['index']} of {len(reqs)} (budget "
            f"{r.get('budget')}, {'violated' if r.get('honored') is False else 'honoured'}): "
            f"steps {win[0] if win else '—'}–{win[-1] if win else '—'} of {len(steps)}</p>")
    return f"<style>{CSS}</style>" + head + grid_html(g, r, decode, end_ids, steps=win)
