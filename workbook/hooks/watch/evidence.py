"""Evidence helpers of the start-up watch (``workbook.hooks.watch.core``): the watched tensors'
layout, the device's name and memory per start-up phase, and the process's module table.

The module table (``modules.json``: base name -> [[module, path], ...]) lets a memcheck frame,
which carries a file's base name only, be judged by its module
(``workbook.run.writer.frames.frame_module``). Nothing here compares or records a change.
"""

from __future__ import annotations

import json
import os
import sys


def device_memory() -> dict:
    """PyTorch's allocated / peak / reserved bytes and the device's free memory, in GiB (the
    start-up's memory per phase: what a profiling run needs, with and without the sanitizer's
    own share — the device's used memory beyond PyTorch's reserved)."""
    import torch

    g = 1 << 30
    try:
        free, total = torch.cuda.mem_get_info()
        res = torch.cuda.memory_reserved()
        return {"allocated_gib": round(torch.cuda.memory_allocated() / g, 2),
                "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / g, 2),
                "reserved_gib": round(res / g, 2), "free_gib": round(free / g, 2),
                "outside_pytorch_gib": round((total - free - res) / g, 2)}
    except Exception as e:  # evidence only
        return {"error": f"{type(e).__name__}: {e}"}


def device_name(platform) -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if platform == "cuda" else "cpu"
    except Exception:
        return None


def layout(tensors: dict, zones: dict | None = None) -> list[dict]:
    """The watched tensors by address; a marker with red zones carries ``redzone`` (its
    padded buffer: ``workbook.hooks.watch.redzone.RedZones.layout``)."""
    rows = sorted((t.data_ptr(), n, t.numel() * t.element_size()) for n, t in tensors.items())
    base = rows[0][0] if rows else 0
    return [{"name": n, "ptr": p, "ptr_hex": hex(p), "nbytes": k, "offset": p - base,
             "device": str(tensors[n].device),
             **({"redzone": zones[n]} if zones and n in zones else {})} for p, n, k in rows]


def write_module_table(out_dir: str, last_n: int) -> int:
    """``out_dir/modules.json`` from ``sys.modules`` when its size differs from ``last_n`` (modules
    were imported since); returns the size written for."""
    mods = list(sys.modules.items())
    if len(mods) == last_n:
        return last_n
    table: dict[str, list] = {}
    for name, m in mods:
        f = getattr(m, "__file__", None)
        if isinstance(f, str) and f.endswith(".py"):
            table.setdefault(os.path.basename(f), []).append([name, f])
    path = os.path.join(out_dir, "modules.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(table, fh)
    os.replace(path + ".tmp", path)
    return len(mods)
