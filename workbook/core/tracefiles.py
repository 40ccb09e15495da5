"""The trace schema (``workbook.hooks.observe.tracer`` writes it): tables as pandas DataFrames and parquet files; merging files of several processes.

Columns are fixed (``*_COLUMNS``) so an empty trace still has the schema the diagnosis reads.
``save(frames, dir)`` writes ``<name>.parquet`` per table (object columns holding dicts are stored
as JSON text); ``load(dir)`` reads one folder, or merges every ``<pid>/`` sub-folder written by
vLLM's processes (multiprocess engine, ``vllm serve``) into one set of tables.
"""

from __future__ import annotations

import json
import os

import pandas as pd

STEP_COLUMNS = ["step", "path", "num_reqs", "num_logits", "num_draft_tokens", "guard_fixed"]
REQUEST_COLUMNS = [
    "step", "req_id", "slot", "phase", "path", "num_logits", "num_drafts", "draft_tokens",
    "total_len_before", "reasoning_count", "enabled", "use_thinking_budget", "budget_host",
    "budget_device", "gate", "fast_path", "apply_called", "kernels_launched", "last_start",
    "last_end", "scan_pos", "num_sampled_vllm", "num_sampled", "num_rejected", "sampled_vllm",
    "emitted", "total_len_after", "proposed",
    # evidence vs the host truth (workbook.hooks.observe.tracer docstring)
    "batch_pos", "batch_size", "truth_start", "kernel_substituted", "last_start_before",
    "last_end_before", "scan_pos_before", "cache_ref_start", "cache_before_ok",
    "cache_scan_ok", "cache_after_ok", "markers_dev", "markers_ok", "markers_version", "markers_moved",
    "total_len_dev", "history_ok", "kernel_markers", "kernel_budget", "kernel_history_ok",
    "kernel_total_len", "mapping_ok", "positions_ok", "batch_slot", "markers_version0",
    "markers_base_ok", "mapping_slots"]
ROW_COLUMNS = [
    "step", "req_id", "slot", "row", "local_pos", "input_token", "end_logit_raw",
    "end_logit_before_apply", "end_logit_after_apply", "end_logit_final", "forced",
    "forced_final", "topk_ids_before", "topk_vals_before", "topk_ids_after", "topk_vals_after",
    "sampled_vllm", "emitted_token", "draft_accepted", "emitted",
    "from_draft", "count_host", "due", "due_token", "due_logit_before_apply",
    "due_logit_after_apply", "due_logit_kernel",
    "due_logit_sampled", "sampled_top", "sampled_top_logit", "sampled_is_biased",
    "returned_is_biased", "bias_cols", "n_bias_cols"]
# the guard's repairs of its own device state (``workbook.hooks.guard``: one row per field
# repaired; ``found`` = the three replicas' values, ``truth`` = the host's)
GUARD_COLUMNS = ["guard_step", "req_id", "slot", "row", "total_len_before", "field", "found",
                 "truth", "truth_from"]
JSON_COLUMNS = ("markers_dev", "kernel_markers", "mapping_slots")  # dicts, as JSON text
TABLES = ("steps", "requests", "rows", "registrations", "meta", "guard")


def frame(records: list[dict], columns: list[str]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(records, columns=columns)
    return df


def _encode(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object and out[col].map(lambda v: isinstance(v, dict)).any():
            out[col] = out[col].map(lambda v: json.dumps(v, sort_keys=True, default=str))
    return out


def save(frames: dict[str, pd.DataFrame], path: str) -> list[str]:
    os.makedirs(path, exist_ok=True)
    written = []
    for name, df in frames.items():
        p = os.path.join(path, f"{name}.parquet")
        _encode(df).to_parquet(p + ".tmp", index=False)
        os.replace(p + ".tmp", p)
        written.append(p)
    return written


def _read_folder(path: str) -> dict[str, pd.DataFrame]:
    out = {}
    for name in TABLES:
        p = os.path.join(path, f"{name}.parquet")
        if os.path.exists(p):
            out[name] = pd.read_parquet(p)
    return out


RANK_COLUMNS = ("tp_rank", "pp_rank")  # written by the plugin per process (rank.json)


def read_rank(folder: str) -> dict[str, int]:
    """The tp / pp rank of the process that wrote ``folder`` (its ``rank.json``); {} if none."""
    import json

    try:
        with open(os.path.join(folder, "rank.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: int(info[k]) for k in RANK_COLUMNS if k in info}


def load(path: str) -> dict[str, pd.DataFrame]:
    """Tables of one trace folder, or of all ``<pid>/`` sub-folders merged (tagged ``pid``)."""
    frames = _read_folder(path)
    subs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))) \
        if os.path.isdir(path) else []
    parts: dict[str, list[pd.DataFrame]] = {}
    for d in subs:
        rank = read_rank(os.path.join(path, d))
        for name, df in _read_folder(os.path.join(path, d)).items():
            parts.setdefault(name, []).append(df.assign(pid=d, **rank))
    for name, dfs in parts.items():
        merged = pd.concat(dfs, ignore_index=True)
        frames[name] = pd.concat([frames[name], merged], ignore_index=True) \
            if name in frames else merged
    for name, cols in (("steps", STEP_COLUMNS), ("requests", REQUEST_COLUMNS),
                       ("rows", ROW_COLUMNS), ("guard", GUARD_COLUMNS)):
        frames.setdefault(name, pd.DataFrame(columns=cols))
    return frames


def markers(frames: dict[str, pd.DataFrame]) -> dict:
    """The marker ids the tracer read from the runner's reasoning config (``{}`` if none)."""
    meta = frames.get("meta")
    if meta is None or meta.empty or "markers" not in meta.columns:
        return {}
    for m in meta["markers"]:  # the first process that saw a model runner
        m = json.loads(m) if isinstance(m, str) else dict(m or {})
        if m.get("end"):
            return m
    return {}
