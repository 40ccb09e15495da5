"""Tables, plots and the step explorer the notebooks show; all read the trace tables only.

- ``step_table`` / ``request_table`` / ``row_table``: the trace, trimmed to the columns a reader
  needs first (the parquet files keep everything).
- ``plot_end_logits``: the end token's logit per logits row before and after
  ``ThinkingBudgetState.apply`` (symlog scale: a forced row jumps to 1e9).
- ``plot_steps``: sampling path and number of drafts per step, emitted tokens per step.
- ``forced_vs_emitted``: per row, forced or not against the token that was emitted.
- ``step_explorer``: an ipywidgets slider over steps for JupyterLab; ``static_steps_html`` is its
  fallback, since widget views do not survive HTML export (both are shown).

Not here: computing anything the diagnosis depends on.
"""

from __future__ import annotations

import html

import pandas as pd

STEP_COLS = ["step", "path", "num_reqs", "num_logits", "num_draft_tokens", "guard_fixed"]
REQ_COLS = ["step", "req_id", "phase", "path", "num_drafts", "draft_tokens", "reasoning_count",
            "enabled", "use_thinking_budget", "budget_host", "budget_device", "gate",
            "fast_path", "apply_called", "kernels_launched", "last_start", "last_end",
            "scan_pos", "num_sampled_vllm", "num_sampled", "sampled_vllm", "emitted"]
ROW_COLS = ["step", "req_id", "local_pos", "input_token", "end_logit_raw",
            "end_logit_before_apply", "end_logit_after_apply", "end_logit_final", "forced",
            "forced_final", "topk_ids_before", "topk_ids_after", "sampled_vllm",
            "emitted_token", "draft_accepted", "emitted"]


def _cols(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[[c for c in cols if c in df.columns]]


def step_table(frames) -> pd.DataFrame:
    return _cols(frames["steps"], STEP_COLS)


def request_table(frames) -> pd.DataFrame:
    return _cols(frames["requests"], REQ_COLS)


def row_table(frames, step: int | None = None) -> pd.DataFrame:
    rows = frames["rows"]
    if step is not None:
        rows = rows[rows["step"] == step]
    return _cols(rows, ROW_COLS)


def _row_labels(rows: pd.DataFrame) -> list[str]:
    return [f"{s}.{p}" for s, p in zip(rows["step"], rows["local_pos"])]


def plot_end_logits(frames, end_token: int | None = None, max_rows: int = 80):
    """End-token logit per row (step.local_pos), before vs after the budget's bias."""
    import matplotlib.pyplot as plt

    rows = frames["rows"].head(max_rows)
    fig, ax = plt.subplots(figsize=(10, 3.2))
    x = range(len(rows))
    ax.plot(x, rows["end_logit_before_apply"].astype(float), "o", label="before apply",
            alpha=.8)
    ax.plot(x, rows["end_logit_after_apply"].astype(float), "x", label="after apply",
            markersize=9)
    ax.plot(x, rows["end_logit_final"].astype(float), ".", label="handed to sampling")
    emitted_end = rows["emitted_token"] == end_token if end_token is not None else None
    if emitted_end is not None and emitted_end.any():
        for i in [i for i, hit in enumerate(emitted_end) if hit]:
            ax.axvline(i, color="green", alpha=.3)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xticks(list(x))
    ax.set_xticklabels(_row_labels(rows), rotation=90, fontsize=7)
    ax.set_xlabel("logits row (step.local_pos); green: </think> emitted")
    ax.set_ylabel("logit of </think>")
    ax.legend(loc="center right", fontsize=8)
    ax.set_title("End-token logit per row, before and after ThinkingBudgetState.apply")
    fig.tight_layout()
    return fig


def plot_steps(frames):
    """Path, drafts and emitted tokens per step."""
    import matplotlib.pyplot as plt

    steps = frames["steps"]
    reqs = frames["requests"]
    emitted = reqs.groupby("step")["num_sampled"].sum() if len(reqs) else pd.Series(dtype=int)
    fig, ax = plt.subplots(figsize=(10, 2.8))
    colors = ["tab:blue" if p == "Sampler" else "tab:orange" for p in steps["path"]]
    ax.bar(steps["step"], steps["num_draft_tokens"], color=colors, label="drafts verified")
    ax.plot(emitted.index, emitted.values, "k.-", label="tokens emitted")
    ax.set_xlabel("engine step (blue: Sampler, orange: RejectionSampler)")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8)
    ax.set_title("Sampling path and drafts per step")
    fig.tight_layout()
    return fig


def forced_vs_emitted(frames, end_token: int) -> pd.DataFrame:
    """Counts of rows by (forced after apply, forced in sampled logits, emitted </think>)."""
    rows = frames["rows"]
    if rows.empty:
        return pd.DataFrame()
    emitted = rows[rows["emitted"].astype(bool)]
    t = emitted.assign(emitted_end=emitted["emitted_token"] == end_token)
    return (t.groupby(["forced", "forced_final", "emitted_end"]).size()
            .rename("rows").reset_index())


def static_steps_html(frames, max_steps: int = 40) -> str:
    """The step explorer's content as plain HTML (survives nbconvert export)."""
    parts = []
    for step in list(frames["steps"]["step"])[:max_steps]:
        req = request_table(frames)
        req = req[req["step"] == step]
        parts.append(f"<details><summary>step {int(step)} — "
                     f"{html.escape(str(req['path'].iloc[0]) if len(req) else '')}</summary>"
                     f"{req.to_html(index=False)}{row_table(frames, step).to_html(index=False)}"
                     "</details>")
    return "\n".join(parts)


def step_explorer(frames):
    """ipywidgets: a slider over steps showing that step's request and row tables."""
    import ipywidgets as w
    from IPython.display import display

    steps = list(frames["steps"]["step"])
    if not steps:
        return w.HTML("<i>no steps traced</i>")
    out = w.Output()
    slider = w.IntSlider(min=int(min(steps)), max=int(max(steps)), description="step")

    def show(change=None):
        out.clear_output()
        with out:
            s = slider.value
            display(request_table(frames).query("step == @s"))
            display(row_table(frames, s))

    slider.observe(show, names="value")
    show()
    return w.VBox([slider, out])
