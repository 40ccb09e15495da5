"""Correct a committed grid by a re-run of some of its points, made after a fix of the judge.

    python scripts/apply_rerun.py GRID_FOLDER RERUN_FOLDER --why "what was wrong, the fix"

Each cell of the re-run (``RERUN_FOLDER/grid.json``, a ``workbook run constraints`` folder of the
same entry, version and batches, limited to the points to correct) whose verdict differs replaces
the committed cell with the same constraint, method, batch and axis point (axes filled with the
grids' defaults; the cell's ``rerun`` names the folder its evidence is in);
the committed grid gains a ``corrections`` note (the date, ``--why``, the re-run's folder, which
cells changed from what to what) that the report shows above the grid and that
``workbook.report`` counts from. Nothing else of the committed folder changes (its evidence stays
the original run's; the re-run folder keeps its own). Refused, one line and exit 2: a re-run of
another vLLM version, a re-run cell no committed cell matches, a re-run that is not finished.
Deliberately not here: re-judging without an engine (``scripts/rejudge_grammar.py`` does that
for the grammar's cells only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def key(cell: dict, defaults: dict) -> tuple:
    axes = {**defaults, **{k: str(v) for k, v in (cell.get("axes") or {}).items()}}
    return cell["constraint"], cell["method"], cell["batch"], tuple(sorted(axes.items()))


def apply(grid_dir: str, rerun_dir: str, why: str) -> list[str]:
    from workbook.core import rundir

    grid, rerun = (rundir.read_json(os.path.join(d, "grid.json")) for d in (grid_dir, rerun_dir))
    if grid is None or rerun is None:
        raise SystemExit(f"apply_rerun: no grid.json in {grid_dir if grid is None else rerun_dir}")
    if (rundir.read_json(os.path.join(rerun_dir, rundir.MANIFEST)) or {}).get("status") != "ok":
        raise SystemExit(f"apply_rerun: {rerun_dir} is not a finished run (manifest status)")
    if rerun.get("vllm_version") != grid.get("vllm_version"):
        raise SystemExit(f"apply_rerun: the re-run is of vLLM {rerun.get('vllm_version')}, the "
                         f"grid of {grid.get('vllm_version')}")
    defaults = {k: str(v) for k, v in (grid.get("axis_defaults") or {}).items()}
    index = {key(c, defaults): i for i, c in enumerate(grid["cells"])}
    changed, lines = [], []
    rel = os.path.relpath(os.path.abspath(rerun_dir), ROOT)
    for c in rerun["cells"]:
        k = key(c, defaults)
        if k not in index:
            raise SystemExit(f"apply_rerun: no committed cell {k[:3]} at {dict(k[3])}")
        old = grid["cells"][index[k]]
        if old["status"] == c["status"]:
            continue  # the same verdict: the committed cell and its evidence stay
        changed.append({"constraint": k[0], "method": k[1], "batch": k[2],
                        "axes": c.get("axes") or {}, "was": old["status"], "now": c["status"]})
        lines.append(f"{k[0]} / {k[1]} / {k[2]} {c.get('axes') or ''}: "
                     f"{old['status']} -> {c['status']}")
        grid["cells"][index[k]] = {**c, "axes": old.get("axes"), "rerun": rel}
    grid.setdefault("corrections", []).append({
        "date": dt.date.today().isoformat(), "rerun": rel, "changed": changed,
        "what": f"{why} Re-run with the fixed judge ({rel}): "
                + ("; ".join(lines) if lines else "no cell changed") + "."})
    plain = os.path.join(grid_dir, "grid.json")
    rundir.write_json(plain, grid)
    if os.path.exists(plain + ".gz"):  # kept lean, as it was committed
        os.remove(plain + ".gz")
        from lean_outputs import gzip_file

        gzip_file(plain)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid_folder")
    ap.add_argument("rerun_folder")
    ap.add_argument("--why", required=True, help="what was wrong and the fix (one sentence)")
    a = ap.parse_args(argv)
    try:
        lines = apply(a.grid_folder, a.rerun_folder, a.why)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print("\n".join(lines) or "no cell changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
