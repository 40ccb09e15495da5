"""A constraints grid's run folder in a few lines: counts per axis value (held / violated /
refused / not judged / other), engine starts, cells per start, wall time, the violations and
the cells that did not reach their axis value — what scripts/gpu_hunt.sh prints per step and
outputs/cpu/constraints-hunt-*/README.md tabulates.

    python scripts/hunt_summary.py RUN_FOLDER [RUN_FOLDER ...] [--markdown]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbook.core import rundir  # noqa: E402
from workbook.run.constraints.grid import summary_lines  # noqa: E402

COLS = ("holds", "violated", "refused", "not judged")


def grid_of(folder: str) -> dict:
    path = folder if folder.endswith((".json", ".json.gz")) else os.path.join(folder, "grid.json")
    if os.path.isdir(folder) and not os.path.exists(path) and not os.path.exists(path + ".gz"):
        found = sorted(glob.glob(os.path.join(folder, "**", "grid.json*"), recursive=True))
        path = found[-1].removesuffix(".gz") if found else path
    return rundir.read_json(path.removesuffix(".gz"), {}) or {}


def per_value(grid: dict) -> dict[tuple[str, str], Counter]:
    """(axis, value) -> status counts; the default point counts as ("default", "")."""
    defaults = grid.get("axis_defaults") or {}
    out: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for c in grid.get("cells") or []:
        moved = [(n, v) for n, v in (c.get("axes") or {}).items() if v != defaults.get(n)]
        for k in moved or [("default", "")]:
            out[k][c["status"]] += 1
    return out


def lines(folder: str, markdown: bool = False) -> list[str]:
    g = grid_of(folder)
    if not g:
        return [f"{folder}: no grid.json"]
    b = g.get("benchmark") or {}
    head = (f"{g.get('run')} on vLLM {g.get('vllm_version')}: {len(g.get('cells') or [])} "
            f"cells, methods {', '.join(g.get('methods') or [])}, status {g.get('status')}; "
            f"engine starts {b.get('engine_starts')} (+{b.get('engines_refused')} refused), "
            f"{b.get('cells_per_start')} cells per start, wall {b.get('wall_seconds')} s")
    out = [head]
    rows = sorted(per_value(g).items(), key=lambda kv: (kv[0][0] != "default", kv[0]))
    if markdown:
        out += ["", "| axis | value | " + " | ".join(COLS) + " | other |",
                "|---|---|" + "---:|" * (len(COLS) + 1)]
    for (n, v), cnt in rows:
        other = sum(x for s, x in cnt.items() if s not in COLS)
        if markdown:
            out.append(f"| {n} | {v} | " + " | ".join(str(cnt.get(s, 0)) for s in COLS)
                       + f" | {other} |")
        else:
            out.append(f"  {n}={v}: " + ", ".join(f"{s} {cnt.get(s, 0)}" for s in COLS)
                       + (f", other {dict((s, x) for s, x in cnt.items() if s not in COLS)}"
                          if other else ""))
    for e in g.get("engines") or []:
        if e.get("status") != "ok":
            out.append(f"  engine {e.get('method')} [{'; '.join(e.get('points') or [])[:160]}]"
                       f": {e.get('status')}: {str(e.get('message'))[:300]}")
    out += ["  " + x for x in summary_lines(g)[1:]]
    unreached = Counter(u.split(":")[0] for c in g.get("cells") or []
                        for u in c.get("unreached") or [])
    for k, x in sorted(unreached.items()):
        out.append(f"  unreached {k}: {x} cell(s)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    for f in a.folders:
        print("\n".join(lines(f, a.markdown)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
