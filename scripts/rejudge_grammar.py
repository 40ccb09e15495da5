"""Re-judge a finished grid's structured-output cells by their grammar, without an engine: the
committed row evidence (``evidence/<method>/<batch>.json``) through the grid's own judge
(``constraints.grammar_evidence``, so the rows it binds are ``contracts.grammar_bound_rows``'), the
grammar compiled from the tiny model's folder as vLLM's xgrammar backend compiles it
(``vllm.grammar.for_model``), each case's prompt rebuilt as the grid built it at the cell's
point (``constraints.prompt_of``). One line per cell whose verdict this changes, then the
counts. For a run made with an older judge (e.g. the H100 run of vLLM 0.34.0):

    python scripts/rejudge_grammar.py RUN_DIR [RUN_DIR ...]

Exit 0; 2 (one line) when a folder is not a grid run folder."""

from __future__ import annotations

import glob
import json
import os
import sys
from types import SimpleNamespace


def _evidence(run: str) -> dict:
    """(method, batch, the point's "axis=value" set) -> the file's evidence per case."""
    from workbook.core import rundir

    out = {}
    for f in glob.glob(os.path.join(run, "evidence", "*", "*.json*")):
        name = os.path.basename(f).removesuffix(".gz").removesuffix(".json")
        batch, _, point = name.partition("@")
        out[(os.path.basename(os.path.dirname(f)), batch,
             frozenset(filter(None, point.split(","))))] = rundir.read_json(
            f.removesuffix(".gz"))
    return out


def rejudge(run: str) -> dict:
    from workbook.core import budget, contracts
    from workbook.core.contracts.base import Params
    from workbook.run.constraints import axes as A
    from workbook.run.constraints import cases as C
    from workbook.run.constraints import grid as G
    from workbook.vllm import grammar as vgrammar
    from workbook.core import models

    grid = json.load(open(os.path.join(run, "grid.json")))
    folder = models.build(G.config_for("none").model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ids = lambda s: (int(tok.convert_tokens_to_ids(s)),)
    markers = budget.Markers(ids("<think>"), ids("</think>"), ids("</think>"))
    engine = SimpleNamespace(grammar_for=lambda p: (*vgrammar.for_model(folder, p)[:2], True))
    known = G.plan("constraints", only="hunt", methods=["mtp"], on_cpu=True).axes
    evidence = _evidence(run)
    counts = {"cells": 0, "violated before": 0, "violated now": 0}
    for cell in grid["cells"]:
        if not cell["constraint"].startswith("structured_output") or \
                cell["status"] in ("refused", "error"):
            continue
        point = {k: str(v) for k, v in (cell.get("axes") or {}).items()}
        ev = evidence.get((cell["method"], cell["batch"],
                           frozenset(f"{k}={v}" for k, v in point.items())), {})
        rec = ev.get(cell["constraint"])
        if not rec or not rec.get("steps"):
            continue
        cfg = A.config(G.config_for(cell["method"]), {k: known[k] for k in point if k in known},
                       {k: v for k, v in point.items() if k in known})
        req = rec["req_id"]
        rc = SimpleNamespace(params={req: Params(**rec["params"])}, steps=rec["steps"],
                             prompts={req: C.prompt_of(tok, cell["constraint"], cfg)},
                             markers=markers)
        _, why, rows = C.grammar_evidence(engine, rc, req, cell["output"])
        before = cell["status"] == "violated" and (cell.get("first") or {}).get(
            "stage") == "grammar bitmask"
        counts["cells"] += 1
        counts["violated before"] += before
        counts["violated now"] += bool(rows)
        if before != bool(rows) or why:
            at = rows[0] if rows else cell["first"]
            print(f"{cell['constraint']} / {cell['method']} / {cell['batch']} "
                  f"{A.label(point) if point else ''}: "
                  f"{'violated' if before else 'held'} -> {'violated' if rows else 'held'}"
                  f" (step {at.get('step')} row {at.get('row')}, output index "
                  f"{at.get('out_index')} of {len(cell['output'])} returned)"
                  + (f"; {why}" if why else ""))
    return counts


def main(argv=None) -> int:
    runs = (argv if argv is not None else sys.argv[1:]) or []
    bad = [r for r in runs if not os.path.exists(os.path.join(r, "grid.json"))]
    if not runs or bad:
        print(f"rejudge_grammar: not a grid run folder: {(bad or ['(none given)'])[0]}",
              file=sys.stderr)
        return 2
    for r in runs:
        c = rejudge(r)
        print(f"{r}: {c['cells']} structured cells re-judged; grammar violations "
              f"{c['violated before']} before, {c['violated now']} now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
