"""Evidence from several ranks (tensor / pipeline parallel vLLM, docs/parallel.md).

Every worker process writes its trace into its own ``<pid>/`` folder with a ``rank.json``
(``workbook.hooks.plugin``); ``workbook.core.tracefiles.load`` tags each row with ``tp_rank`` /
``pp_rank``. Only the last pipeline stage samples; each of its tensor-parallel ranks holds its
own ``ThinkingBudgetState`` and applies it to the same rows. The verdict is judged on one
sampling rank (tp 0 of the last stage: the rank whose output vLLM returns); the other sampling
ranks must agree with it on every budget-state field and every emitted token — a rank that
differs is a finding of its own (``agreement``).
"""

from __future__ import annotations

import pandas as pd

# the budget state and its effect, per (step, request): what every sampling rank must share
STATE_FIELDS = ("enabled", "use_thinking_budget", "budget_host", "budget_device", "gate",
                "fast_path", "last_start", "last_end", "emitted")
KEY = ("step", "req_id")


def has_ranks(frames: dict) -> bool:
    req = frames.get("requests")
    return req is not None and "tp_rank" in getattr(req, "columns", ())


def sampling_ranks(frames: dict) -> list[tuple[int, int]]:
    """(pp_rank, tp_rank) of every rank that traced sampled steps (the last stage's ranks)."""
    req = frames["requests"]
    if req.empty:
        return []
    last = int(req["pp_rank"].max())
    return sorted({(last, int(t)) for t in req.loc[req["pp_rank"] == last, "tp_rank"]})


def of_rank(frames: dict, pp_rank: int, tp_rank: int) -> dict:
    """The tables of one rank (tables without rank columns are kept whole)."""
    out = {}
    for name, df in frames.items():
        if isinstance(df, pd.DataFrame) and "tp_rank" in df.columns:
            out[name] = df[(df["tp_rank"] == tp_rank) & (df["pp_rank"] == pp_rank)] \
                .reset_index(drop=True)
        else:
            out[name] = df
    return out


def _norm(v):
    if isinstance(v, float) and v != v:
        return None
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def agreement(frames: dict) -> dict:
    """Compare every sampling rank's budget state with the reference rank's (the first).
    Returns ``ranks`` (as "pp<p>/tp<t>"), ``reference``, ``compared_rows``, ``agree`` and
    ``differences`` (the first 20: step, request, field, both values)."""
    ranks = sampling_ranks(frames)
    label = [f"pp{p}/tp{t}" for p, t in ranks]
    out = {"ranks": label, "reference": label[0] if label else "", "compared_rows": 0,
           "agree": True, "differences": []}
    if len(ranks) < 2:
        return out
    req = frames["requests"]
    fields = [f for f in STATE_FIELDS if f in req.columns]
    ref = of_rank(frames, *ranks[0])["requests"].set_index(list(KEY))
    diffs = []
    for (p, t), name in zip(ranks[1:], label[1:]):
        other = of_rank(frames, p, t)["requests"].set_index(list(KEY))
        common = ref.index.intersection(other.index)
        for key in ref.index.symmetric_difference(other.index):
            diffs.append({"rank": name, "step": int(key[0]), "req_id": str(key[1]),
                          "field": "present", "reference": key in ref.index,
                          "value": key in other.index})
        out["compared_rows"] += len(common)
        for key in common:
            for f in fields:
                a, b = _norm(ref.at[key, f]), _norm(other.at[key, f])
                if a != b:
                    diffs.append({"rank": name, "step": int(key[0]), "req_id": str(key[1]),
                                  "field": f, "reference": a, "value": b})
    out["agree"] = not diffs
    out["differences"] = diffs[:20]
    out["differences_total"] = len(diffs)
    return out
