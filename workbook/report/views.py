"""Tables, plots and the step explorer the notebooks show; all read the trace tables only.

- ``step_table`` / ``request_table`` / ``row_table``: the trace, trimmed to the columns a reader
  needs first (the parquet files keep everything), token ids decoded when a ``decode`` is given.
- ``plot_end_logits``: the end token's logit per logits row of one request, before and after
  ``ThinkingBudgetState.apply`` (forced rows, +1e9, drawn in a band of their own).
- ``plot_steps``: sampling path and number of drafts per step, emitted tokens per step.
- ``forced_vs_emitted``: per row, forced or not against the token that was emitted.
- ``step_explorer``: the steps × rows grid (``workbook.report.grid``) as ipywidgets for
  JupyterLab; ``static_steps_html`` is what an exported notebook keeps.
- ``table(rows, empty)``: what a notebook cell shows for a table — the table made readable
  (``readable``: budgets as integers or "no budget", absent cells "—", never ``None`` / ``NaN``
  / ``null``), or the sentence ``empty`` when there are no rows; ``verdict_heading`` /
  ``config_table`` / ``values_table``: the verdict's heading and key → value tables with one
  wording per absent fact (``workbook.report.wording``).
- ``first_violation(v)``: the first violation as a row whose ``what`` says its kind in a
  sentence; ``guard_sentence(v)`` / ``guard_repairs(v, frames)``: what the guard did in a run
  and every repair of its own state it logged.

Not here: computing anything the diagnosis depends on.
"""

from __future__ import annotations

import pandas as pd

from workbook.report import grid, tokens, wording
from workbook.report.tokens import decoder  # noqa: F401  (notebooks: views.decoder(...))

STEP_COLS = ["step", "path", "num_reqs", "num_logits", "num_draft_tokens", "guard_fixed"]
REQ_COLS = ["step", "req_id", "phase", "path", "num_drafts", "draft_tokens", "reasoning_count",
            "enabled", "use_thinking_budget", "budget_host", "budget_device", "gate",
            "fast_path", "apply_called", "kernels_launched", "last_start", "last_end",
            "scan_pos", "num_sampled_vllm", "num_sampled", "sampled_vllm", "emitted"]
ROW_COLS = ["step", "req_id", "local_pos", "input_token", "end_logit_raw",
            "end_logit_before_apply", "end_logit_after_apply", "end_logit_final", "forced",
            "forced_final", "topk_ids_before", "topk_ids_after", "sampled_vllm",
            "emitted_token", "draft_accepted", "emitted"]
TOKEN_COLS = ("input_token", "sampled_vllm", "emitted_token")
TOKEN_LIST_COLS = ("draft_tokens", "sampled_vllm", "emitted")


BUDGET_COLS = ("budget", "budget_host", "budget_device", "thinking_token_budget")


def _cell(v, column: str = ""):
    if column in BUDGET_COLS or column.startswith("budget "):
        return wording.budget_text(v)
    if isinstance(v, (list, tuple)):
        return [_cell(x) for x in v] if column == "budgets" else v
    try:
        if hasattr(v, "tolist") and not isinstance(v, str):  # numpy arrays / scalars
            return _cell(v.tolist(), column)
    except Exception:  # pragma: no cover
        pass
    if wording.absent(v):
        return wording.DASH
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` for reading: budgets as integers or "no budget", absent cells "—", integral
    floats as integers (pandas turns an int column with a gap into floats)."""
    out = df.copy()
    for c in out.columns:
        out[c] = [_cell(v, str(c)) for v in out[c].tolist()]
    return out


def table(rows, empty: str, columns: list[str] | None = None):
    """A notebook's table: ``rows`` (a DataFrame, a list of dicts or a dict of columns)
    readable, or the sentence ``empty`` (Markdown) when there is nothing to show."""
    from IPython.display import Markdown

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows or [], columns=columns)
    if df.empty:
        return Markdown(empty)
    return readable(df)


def values_table(values: dict, name: str = "value", missing: str = wording.NOT_RECORDED,
                 meaning: dict | None = None) -> pd.DataFrame:
    """A key → value table (an effective configuration, an outcome, a summary), each absent
    value said with ``missing`` (one wording per fact), lists / dicts as JSON."""
    rows = {k: wording.value_text(v, missing if not meaning or k not in meaning
                                  else meaning[k]) for k, v in values.items()}
    return pd.DataFrame({name: rows})


def config_table(cfg) -> pd.DataFrame:
    """A RunConfig's fields: the value, or what leaving it unset means (from the field's
    help in ``workbook.core.config``: "None: vLLM's pick")."""
    meaning = {k: f"not set ({h})" for k, h in _config_help().items()}
    values = cfg.to_dict()
    values["thinking_token_budget"] = wording.budget_text(cfg.thinking_token_budget)
    return values_table(values, missing="not set", meaning=meaning)


def _config_help() -> dict[str, str]:
    """The part of each RunConfig field's comment that says what ``None`` means."""
    import inspect
    import re

    from workbook.core import config

    found = {}
    for line in inspect.getsource(config.RunConfig).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=[^#]*#\s*(.*)", line)
        if m:
            said = re.search(r"None:\s*([^;]+)", m.group(2))
            if said:
                found[m.group(1)] = said.group(1).strip()
    return found


def verdict_heading(verdict: dict | None) -> str:
    return wording.verdict_heading(verdict)


def verdict_markdown(verdict: dict | None, level: str = "###"):
    """The verdict's heading, then its summary when the heading does not already say it."""
    from IPython.display import Markdown

    head = wording.verdict_heading(verdict)
    said = wording.said((verdict or {}).get("summary"))
    body = "" if wording.absent(said) or said in head else f"\n\n{said}"
    return Markdown(f"{level} {head}{body}" if level else f"**{head}**{body}")


FV_COLS = ("req_id", "budget", "kind", "step", "path", "row", "local_pos", "output_index",
           "batch_size")


def first_violation(verdict: dict | None, decode=None) -> list[dict]:
    """The verdict's first violation as one table row: where (request, step, row, output
    index), its ``kind`` and ``what`` — one sentence per kind (``wording.violation_text``),
    so a forced kind shows no "expected token" it never had. ``[]`` when nothing was
    violated."""
    fv = (verdict or {}).get("first_violation") or {}
    if not fv:
        return []
    label = (lambda t: tokens.label(decode, t)) if decode else None
    row = {k: fv.get(k) for k in FV_COLS}
    row["kind"] = fv.get("kind") or "missing"
    row["what"] = wording.violation_text(fv, label)
    return [row]


def guard_sentence(verdict: dict | None) -> str:
    """What the guard did in a run (``wording.guard_text`` over ``verdict["guard"]``)."""
    said = wording.guard_text((verdict or {}).get("guard"))
    return said[0].upper() + said[1:]


def guard_repairs(verdict: dict | None, frames: dict | None = None) -> pd.DataFrame:
    """Every repair the guard logged: the trace's ``guard`` table (``tracefiles.GUARD_COLUMNS``),
    else the verdict's ``guard.repairs`` (the first records)."""
    g = (frames or {}).get("guard")
    if g is not None and not g.empty:
        return g
    return pd.DataFrame(((verdict or {}).get("guard") or {}).get("repairs") or [])


def offsets(verdict: dict | None) -> list[dict]:
    """Expected vs actual end index of every budgeted request: the verdict's ``offsets`` when
    it lists them (violated runs), else derived from its judged ``requests`` and markers."""
    from workbook.core import budget

    v = verdict or {}
    if v.get("offsets"):
        return list(v["offsets"])
    end = budget.Markers.of(v.get("markers") or {}).end
    out = []
    for r in v.get("requests") or []:
        if r.get("budget") is None:
            continue
        actual = r.get("actual_end_index")
        if actual is None and end:
            found = budget.first_index_of(list(r.get("output") or []), end)
            actual = None if found == -1 else found
        out.append({"req_id": r.get("req_id"), "budget": r.get("budget"),
                    "expected_end_index": r.get("expected_end_index"),
                    "actual_end_index": actual, "honored": r.get("honored")})
    return out


def _cols(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[[c for c in cols if c in df.columns]]


def step_table(frames) -> pd.DataFrame:
    return readable(_cols(frames["steps"], STEP_COLS))


def request_table(frames, decode=None) -> pd.DataFrame:
    df = _cols(frames["requests"], REQ_COLS).copy()
    if decode is not None:
        for c in TOKEN_LIST_COLS:
            if c in df:
                df[c] = df[c].map(lambda ids: " ".join(tokens.show(decode(t), 10)
                                                       for t in (list(ids) if ids is not None
                                                                 else [])))
    return readable(df)


def row_table(frames, step: int | None = None, decode=None) -> pd.DataFrame:
    rows = frames["rows"]
    if step is not None:
        rows = rows[rows["step"] == step]
    df = _cols(rows, ROW_COLS).copy()
    if decode is not None:
        for c in TOKEN_COLS:
            if c in df:
                df[c] = df[c].map(lambda t: tokens.label(decode, t))
    return readable(df)


def _row_labels(rows: pd.DataFrame) -> list[str]:
    return [f"{int(s)}·{int(p)}" for s, p in zip(rows["step"], rows["local_pos"])]


def _pick_request(frames, req_id=None, verdict=None):
    if req_id is not None:
        return req_id
    fv = (verdict or {}).get("first_violation") or {}
    if fv.get("req_id") is not None:
        return fv["req_id"]
    rows = frames["rows"]
    return rows["req_id"].iloc[0] if len(rows) else None


def plot_end_logits(frames, end_token: int | None = None, max_rows: int = 80, *,
                    req_id=None, verdict=None):
    """One request's ``</think>`` logit per logits row, before and after the budget's bias.

    Unforced values are on a linear axis; a forced row (the bias sets +1e9) is drawn in a band
    above it, labelled, so neither hides the other. Default request: the first violated one."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    req_id = _pick_request(frames, req_id, verdict)
    rows = frames["rows"]
    rows = rows[rows["req_id"] == req_id].sort_values(["step", "local_pos"]).head(max_rows)
    fig, ax = plt.subplots(figsize=(10, 3.4))
    if rows.empty:
        ax.text(.5, .5, "no logits rows traced", ha="center", transform=ax.transAxes)
        return fig
    before = rows["end_logit_before_apply"].astype(float).to_numpy()
    after = rows["end_logit_after_apply"].astype(float).to_numpy()
    final = rows["end_logit_final"].astype(float).to_numpy()
    normal = [v for v in list(before) + list(after) + list(final)
              if abs(v) < grid.FORCED_MIN and v == v]
    lo, hi = (min(normal), max(normal)) if normal else (-1.0, 1.0)
    span = max(hi - lo, 1.0)
    top, bottom = hi + 0.35 * span, lo - 0.35 * span

    def band(vals):
        return [top if v >= grid.FORCED_MIN else bottom if v <= -grid.FORCED_MIN else v
                for v in vals]

    x = list(range(len(rows)))
    ax.plot(x, band(before), "o", color="tab:blue", alpha=.8, label="before the bias")
    ax.plot(x, band(after), "x", color="tab:orange", markersize=9, label="after the bias")
    ax.plot(x, band(final), ".", color="tab:green", label="handed to sampling")
    ax.axhspan(hi + 0.2 * span, top + 0.15 * span, color="#e8f5e8", zorder=0)
    ax.text(0.995, top, "forced (+1e9)", ha="right", va="center", fontsize=8,
            transform=ax.get_yaxis_transform(), color="#1a7f37")
    if any(v <= -grid.FORCED_MIN for v in list(before) + list(after) + list(final)):
        ax.axhspan(bottom - 0.15 * span, lo - 0.2 * span, color="#f3e8e8", zorder=0)
        ax.text(0.995, bottom, "masked (≤ −1e6)", ha="right", va="center", fontsize=8,
                transform=ax.get_yaxis_transform(), color="#a01010")
    if end_token is not None:
        for i, t in enumerate(rows["emitted_token"]):
            if t == t and t is not None and int(t) == int(end_token):
                ax.axvline(i, color="green", alpha=.25, lw=6)
    ax.set_ylim(bottom - 0.2 * span, top + 0.2 * span)
    ax.yaxis.set_major_locator(MaxNLocator(5))
    labels = _row_labels(rows)
    every = max(1, len(labels) // 40)
    ax.set_xticks(x[::every])
    ax.set_xticklabels(labels[::every], rotation=90, fontsize=7)
    ax.set_xlabel("logits row (step · local_pos); green column: </think> emitted")
    ax.set_ylabel("logit of </think>")
    handles = ax.get_legend_handles_labels()[0] + [
        Line2D([], [], color="green", alpha=.25, lw=6, label="</think> emitted")]
    ax.legend(handles=handles, loc="upper left", fontsize=8, ncol=4, framealpha=.9)
    ax.set_title(f"Request {req_id}: end-token logit per row, before and after "
                 "ThinkingBudgetState.apply", fontsize=10)
    fig.tight_layout()
    return fig


def plot_steps(frames):
    """Path, drafts and emitted tokens per step (legend colours = bar colours)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    steps = frames["steps"]
    reqs = frames["requests"]
    emitted = reqs.groupby("step")["num_sampled"].sum() if len(reqs) else pd.Series(dtype=int)
    fig, ax = plt.subplots(figsize=(10, 2.8))
    colors = ["tab:blue" if p == "Sampler" else "tab:orange" for p in steps["path"]]
    ax.bar(steps["step"], steps["num_draft_tokens"], color=colors)
    ax.plot(emitted.index, emitted.values, "k.-")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens")
    ax.legend(handles=[Patch(color="tab:blue", label="drafts verified (Sampler: none)"),
                       Patch(color="tab:orange", label="drafts verified (RejectionSampler)"),
                       Line2D([], [], color="k", marker=".", label="tokens emitted")],
              fontsize=8, loc="upper right")
    ax.set_title("Sampling path and drafts per step")
    fig.tight_layout()
    return fig


def forced_vs_emitted(frames, end_token: int) -> pd.DataFrame:
    """Counts of rows by (forced after apply, forced in sampled logits, emitted </think>)."""
    from IPython.display import Markdown

    rows = frames["rows"]
    if rows.empty:
        return Markdown("No logits rows were traced: nothing to count.")
    emitted = rows[rows["emitted"].fillna(False).astype(bool)]
    t = emitted.assign(emitted_end=emitted["emitted_token"] == end_token)
    return (t.groupby(["forced", "forced_final", "emitted_end"]).size()
            .rename("rows").reset_index())


def step_explorer(frames, verdict=None, decode=None, end_ids=None):
    """The steps × rows explorer (ipywidgets): request picker, window of steps, overview
    strip of every step, the selected cell's details. See ``workbook.report.grid``."""
    return grid.explorer(frames, verdict, decode, end_ids)


def static_steps_html(frames, verdict=None, decode=None, end_ids=None) -> str:
    """The explorer's first view as plain HTML (survives nbconvert export)."""
    return grid.explorer_static(frames, verdict, decode, end_ids)
