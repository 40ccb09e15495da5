"""Blame on defects written outside the workbook (issue 39): per defect, is every changed request
reported at its exact first row, with the right contract, stage and source — and no healthy
request reported violated?

The defects sit inside vLLM's own modules (tests/_defects.py; not in the workbook's catalogue).
The constraint defects run the sequence of batches of ``tests/test_blame.CASES`` healthy, then
with the defect (the batch-invariance reference ``auto``, as the grid runs it), then the last
batch healthy again with ``invariance=on`` (every request alone on a fresh slot: its false
alarms and its cost). Ground truth is the healthy run's row evidence (``_first_change``). The
budget defects run ``tests/test_blame.BUDGET_CASES`` through the tracer and the diagnosis.

    PYTHONPATH=. .venv/bin/python benchmarks/blame.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "outputs", "cpu",
                                                  "benchmarks", "blame.json"))
    a = ap.parse_args(argv)
    from tests import _defects
    from tests import test_blame as T
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose
    from workbook.run.constraints import cases as C
    from workbook.run.constraints import grid as G
    from workbook.run.constraints import invariance
    from workbook.vllm import engine as vengine

    t0 = time.time()
    eng = vengine.start(G.config_for("mtp"))
    kw = {c: T.EXTRA.get(c) or C.case_kwargs(c, [0] * 16, eng.tokenizer.decode)
          for c in (*C.CONSTRAINTS, *T.EXTRA)}

    plain = C.RunConfig(trace=False, thinking_token_budget=-1, max_tokens=16)  # the grid's

    def send(batches, cfg=plain):
        for b in batches:
            cells, ev = C.run_batch(eng, {c: kw[c] for c in b}, zero_head=True, cfg=cfg,
                                    batch="mixed" if len(b) > 1 else "single")
        return cells, ev

    out = {"constraints": {}, "budget": {}, "healthy_invariance_on": {}}
    for name, (batches, want) in sorted(T.CASES.items()):
        print(f"{name} ...", flush=True)
        pin = name in T.PINNED  # the slot history the defect needs (tests/test_blame.py)
        healthy, hev = T._send(eng, batches, max_tokens=16, pin=pin)
        invariance.reset_cost()
        with _defects.DEFECTS[name]():
            cells, ev = T._send(eng, batches, max_tokens=16, pin=pin)
        cost = invariance.reset_cost()
        rows = {}
        for c, cell in cells.items():
            truth = T._first_change(hev[c], ev[c])
            changed = truth is not None or cell.output != healthy[c].output
            f = cell.first or {}
            exp = want.get(c)
            rows[c] = {"changed": changed, "status": cell.status, "victim": cell.victim,
                       "caught": changed and cell.status == "violated",
                       "exact": changed and truth == (f.get("step"), f.get("row")),
                       "contract": f.get("contract"), "stage": f.get("stage"),
                       "source": f.get("source"),
                       "right": None if exp is None else
                       [f.get("contract") == exp[0], f.get("stage") == exp[1],
                        f.get("source") == exp[2]],
                       "false_alarm": not changed and cell.status == "violated",
                       "what": f.get("what")}
        out["constraints"][name] = {"cells": rows, "invariance_cost": cost}
        # healthy, every request alone on a fresh slot: no request may become a victim
        cfg = plain.replace(invariance="on")
        invariance.reset_cost()
        hcells, _ = send(batches[-1:], cfg)
        out["healthy_invariance_on"][name] = {
            "cells": {c: {"status": x.status, "equal_alone": (x.alone or {}).get("equal")}
                      for c, x in hcells.items()},
            "cost": invariance.reset_cost()}
    end = eng.effective["reasoning_end_token_ids"][0]
    for name, (budgets, kind, hyp, words) in sorted(T.BUDGET_CASES.items()):
        print(f"{name} ...", flush=True)
        with request.zeroed_lm_head(eng), Tracer():
            healthy = request.run_budgets(eng, budgets, 8)
        with _defects.BUDGET_DEFECTS[name](end), request.zeroed_lm_head(eng), Tracer() as t:
            outs = request.run_budgets(eng, budgets, 8)
        v = diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)
        changed = sum(1 for h, o in zip(healthy, outs) if h.token_ids != o.token_ids)
        vi = (v.get("violations") or [{}])[0]
        saw = ((vi.get("causes") or [{}])[0]).get("saw", "")
        out["budget"][name] = {"changed_requests": changed,
                               "violated_requests": len(v.get("violations") or []),
                               "kind": vi.get("kind"), "hypothesis": vi.get("hypothesis"),
                               "right": vi.get("kind") == kind and vi.get("hypothesis") == hyp,
                               "guard_said": "the guard does not take it back" in saw,
                               "summary": v.get("summary")}
    invariance.release()
    eng.shutdown()
    out["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    for name, r in out["constraints"].items():
        ch = [x for x in r["cells"].values() if x["changed"]]
        fa = sum(x["false_alarm"] for x in r["cells"].values())
        right = [x["right"] for x in ch if x["right"]]
        print(f"{name}: changed {len(ch)}, caught {sum(x['caught'] for x in ch)}, exact "
              f"{sum(x['exact'] for x in ch)}, contract/stage/source right "
              f"{sum(r_[0] for r_ in right)}/{sum(r_[1] for r_ in right)}/"
              f"{sum(r_[2] for r_ in right)}, false alarms {fa}; invariance "
              f"{r['invariance_cost']}")
    for name, r in out["healthy_invariance_on"].items():
        print(f"healthy invariance=on after {name}: {r['cells']} cost {r['cost']}")
    for name, r in out["budget"].items():
        print(f"{name}: {r}")
    print(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
