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


def disagreement(agree: dict) -> str | None:
    """The sentence for ranks that disagree (``agreement``'s result), None when they agree: the
    first differing rank, its step and request, and the fields that differ there."""
    diffs = agree.get("differences") or []
    if agree.get("agree", True) or not diffs:
        return None
    d = diffs[0]
    fields = sorted({x["field"] for x in diffs if (x["rank"], x["step"], x["req_id"]) ==
                     (d["rank"], d["step"], d["req_id"])})
    ranks = sorted({x["rank"] for x in diffs})
    return (f"rank {', '.join(ranks)} disagrees with the reference rank {agree['reference']}: "
            f"from step {d['step']} (request {d['req_id']}: {', '.join(fields)} differ) — every "
            "sampling rank applies the budget to the same rows, so this is a finding of its own, "
            "whatever the returned output shows")


# ---- per-rank JSON evidence: the guard's report and the start-up watch ------------------------

def label(rank: dict) -> str:
    return f"pp{int(rank.get('pp_rank', 0))}/tp{int(rank.get('tp_rank', 0))}"


def read_per_rank(folder: str, name: str) -> dict[str, dict]:
    """``<folder>/<pid>/<name>`` of every process that wrote one, keyed by its rank label
    ("pp<p>/tp<t>", from its ``rank.json``; "pid<pid>" without one); each tagged with
    ``tp_rank`` / ``pp_rank`` / ``pid``. Sorted: the last stage first, then tp 0 first (the
    reference sampling rank leads)."""
    import json
    import os

    from workbook.core import tracefiles

    out = []
    if not os.path.isdir(folder):
        return {}
    for d in sorted(os.listdir(folder)):
        p = os.path.join(folder, d, name)
        if not os.path.isfile(p):
            continue
        try:
            with open(p) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        rank = tracefiles.read_rank(os.path.join(folder, d))
        if isinstance(data, dict):
            data = {**data, **rank, "pid": d}
        out.append((rank, d, data))
    out.sort(key=lambda x: (-x[0].get("pp_rank", 0), x[0].get("tp_rank", 0), x[1]))
    return {(label(r) if r else f"pid{d}"): data for r, d, data in out}


def compare(readings: dict[str, dict], fields) -> dict:
    """Every rank's reading against the first's (the reference), field by field. Returns
    ``ranks``, ``reference``, ``agree`` and ``differences`` (rank, field, both values)."""
    labels = list(readings)
    out = {"ranks": labels, "reference": labels[0] if labels else "", "agree": True,
           "differences": []}
    if len(labels) < 2:
        return out
    ref = readings[labels[0]]
    for name in labels[1:]:
        for f in fields:
            a, b = _norm(ref.get(f)), _norm(readings[name].get(f))
            if a != b:
                out["differences"].append({"rank": name, "field": f, "reference": a,
                                           "value": b})
    out["agree"] = not out["differences"]
    return out


# the guard's report: counters (per run: the difference since the run began) and per-request
GUARD_COUNTERS = ("guarded_steps", "fixed_tokens", "taken_back_tokens", "untaken_steps",
                  "untaken_rows", "repaired_fields", "truth_lagged_rows")
GUARD_FIELDS = ("enabled",) + GUARD_COUNTERS + ("repaired_requests",)


def guard_of_run(now: dict, before: dict | None, old_reqs) -> dict:
    """One rank's guard report restricted to one run on a shared engine: counters minus those
    read before the run began, records of requests sent before it dropped."""
    before = before or {}
    old = set(old_reqs or ())
    out = dict(now)
    for k in GUARD_COUNTERS:
        if isinstance(now.get(k), int):
            out[k] = now[k] - int(before.get(k) or 0)
    for k in ("repairs", "untaken"):
        out[k] = [r for r in now.get(k) or [] if r.get("req_id") not in old]
    out["repaired_requests"] = sorted({r["req_id"] for r in out["repairs"] if r.get("req_id")})
    return out


def guard_section(per_rank: dict[str, dict]) -> dict:
    """``verdict["guard"]`` with several ranks: the reference rank's report, every rank's
    counters (``ranks``) and whether they agree (every sampling rank guards the same rows: a
    rank whose guard fixed or repaired something the others did not is a finding)."""
    if not per_rank:
        return {"installed": True, "available": False,
                "why": "no rank wrote its guard report (guard.json next to its trace)"}
    labels = list(per_rank)
    ref = per_rank[labels[0]]
    summary = {lab: {k: r.get(k) for k in ("tp_rank", "pp_rank", "pid") + GUARD_FIELDS}
               for lab, r in per_rank.items()}
    return {"available": True, **ref, "rank": labels[0], "ranks": summary,
            "agreement": compare(per_rank, GUARD_FIELDS)}


def guard_table(per_rank: dict[str, dict]):
    """Every rank's repair records as one table (the trace's ``guard`` table) with the rank
    columns."""
    from workbook.core import tracefiles

    recs = [{**{c: rec.get(c) for c in tracefiles.GUARD_COLUMNS},
             "tp_rank": r.get("tp_rank"), "pp_rank": r.get("pp_rank")}
            for r in per_rank.values() for rec in r.get("repairs") or []]
    return pd.DataFrame.from_records(recs, columns=list(tracefiles.GUARD_COLUMNS)
                                     + ["tp_rank", "pp_rank"])
