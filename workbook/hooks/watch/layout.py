"""Where the watched tensors sit in memory: the caching allocator's segments and their blocks.

The layout evidence of the budget watch. For each watched tensor, the block it lives in, the
blocks around it in its caching-allocator segment (offset from the tensor, size, requested
size, state) and, when PyTorch's memory history was recorded during start-up, the Python stack
that allocated each neighbour — so a write running in from a neighbour can be traced to whose
buffer it came from (``workbook.run.writer.overrun`` reads it). On CPU there are no segments: the
evidence records the tensors' own addresses and gaps and says so.

Also the segment primitives the protection reuses: ``segments`` (``torch.cuda.memory_snapshot``),
``blocks`` (a segment's blocks with their addresses; they tile it) and ``segment_of`` — the NVTX
form registers a protected tensor's segment as a heap with every block a region
(``workbook.hooks.watch.protect``), the red zones size a padded buffer by its block
(``workbook.hooks.watch.redzone``).

Deliberately not here: making anything read-only (``workbook.hooks.watch.protect``), comparing values
(``workbook.hooks.watch``), judging an overrun (``workbook.run.writer.overrun``). Reads only: nothing
here allocates on the device or changes what the engine computes.
"""

from __future__ import annotations

import os


def segments() -> list[dict]:
    import torch

    try:
        return torch.cuda.memory_snapshot()
    except Exception:
        return []


def blocks(seg: dict) -> list[dict]:
    """A segment's blocks with their addresses (they tile the segment, in order)."""
    out, addr = [], seg["address"]
    for b in seg.get("blocks", []):
        a = b.get("address", addr)
        out.append({**b, "address": a})
        addr = a + b["size"]
    return out


def segment_of(ptr: int, segs: list[dict]) -> dict | None:
    return next((s for s in segs if s["address"] <= ptr < s["address"] + s["total_size"]), None)


def _frames(b: dict, n: int = 6) -> list[str]:
    fr = [f for f in b.get("frames") or [] if f.get("filename", "").endswith(".py")]
    keep = [f for f in fr if "/torch/" not in f["filename"]] or fr
    return [f"{f.get('name') or '?'} in {f['filename']}:{f.get('line') or '?'}"
            for f in keep[:n]]


def neighbours(tensors: dict, width: int = 4) -> dict:
    """Layout evidence: for each tensor, its block's neighbours in its caching-allocator
    segment (``width`` each side: offset from the tensor, size, requested size, state and the
    allocation stack when PyTorch's memory history was on). On CPU there are no segments."""
    import torch

    if not tensors:
        return {"platform": None, "note": "no tensors", "tensors": {}}
    dev = next(iter(tensors.values())).device
    if dev.type != "cuda":
        rows = sorted((t.data_ptr(), n, t.numel() * t.element_size()) for n, t in
                      tensors.items())
        return {"platform": dev.type, "caching_allocator": False,
                "note": "CPU: c10's CPU allocator has no caching-allocator segments to read; "
                        "recorded are the watched tensors' own addresses and gaps (the "
                        "neighbour evidence exists on a GPU only)",
                "tensors": {n: {"ptr": hex(p), "nbytes": k,
                                "gap_to_next": (rows[i + 1][0] - p - k) if i + 1 < len(rows)
                                else None}
                            for i, (p, n, k) in enumerate(rows)}}
    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"
    segs = segments() if caching else []
    out = {}
    for n, t in tensors.items():
        p = t.data_ptr()
        seg = segment_of(p, segs)
        if seg is None:
            out[n] = {"ptr": hex(p), "segment": None,
                      "note": "own allocation (caching allocator off)" if not caching else
                      "not in a caching-allocator segment (e.g. pinned/UVA memory)"}
            continue
        bl = blocks(seg)
        i = next((k for k, b in enumerate(bl) if b["address"] <= p < b["address"] + b["size"]),
                 None)
        near = [] if i is None else [
            {"offset": b["address"] - p, "size": b["size"],
             "requested": b.get("requested_size"), "state": b.get("state"),
             "watched": next((m for m, u in tensors.items()
                              if b["address"] <= u.data_ptr() < b["address"] + b["size"]),
                             None),
             "allocated_by": _frames(b)}
            for b in bl[max(0, i - width):i + width + 1]]
        out[n] = {"ptr": hex(p), "segment": hex(seg["address"]),
                  "segment_size": seg["total_size"], "segment_blocks": len(bl),
                  "offset_in_segment": p - seg["address"], "neighbours": near}
    return {"platform": "cuda", "caching_allocator": caching,
            "memory_history": bool(_history_on()), "torch": torch.__version__, "tensors": out}


_HISTORY = {"on": False}


def _history_on() -> bool:
    return _HISTORY["on"]


def record_history(max_entries: int = 200000) -> str | None:
    """PyTorch's memory history (allocation stacks of every block), before the engine
    starts; None when on, else why not."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device: no caching allocator to record"
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
        _HISTORY["on"] = True
        return None
    except Exception as e:  # an older torch: no stacks="python"
        return f"memory history unavailable: {type(e).__name__}: {e}"


def stop_history() -> None:
    """After start-up: no more recording (it would cost every step an allocation record)."""
    if _HISTORY["on"]:
        import torch

        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        finally:
            _HISTORY["on"] = False
