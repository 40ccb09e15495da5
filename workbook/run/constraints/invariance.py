"""The batch-invariance reference: a reference a defect inside vLLM cannot share.

A defect in vLLM is also in the spec-off run, so the differential against ``none`` is silent for
every defect that does not depend on speculation. What vLLM does promise whatever the defect
is its per-request semantics: a request's processed rows and its greedy tokens are a function
of its own parameters and history, not of its neighbours or of the slot's earlier occupants
(``SamplingParams`` is per request). So each request of a batch is sent again alone, on a slot
no request of this engine ever held (``fresh_slot``: vLLM's free-slot list is a stack, the
fresh slot is put on its top; when the engine has none left a fresh engine of the same
configuration is started — slot history matters only there) and its rows and tokens are
compared with the batch's (``compare``): rows matched by the history they saw (committed
output, local position, drafts), the processed values at every column both kept where the raw
values agree, and the emitted token. A request whose rows differ is a victim; its cause is in
the batch or the engine's history, named from evidence (``name_cause``): the registration's
settings it did not ask for and the slot's previous occupant; the neighbours present; and, for
a change no contract explains, the request sent beside each neighbour alone on fresh slots (the
check that separates them): the neighbour whose presence brings the change back.

``check`` runs it for one batch (``run_batch`` calls it where the row check saw a change no
contract explains — ``RunConfig.invariance`` ``auto`` —, for every batch with ``on``); its
cost (re-runs, seconds, engine starts) accumulates in ``COST`` (the grid prints it).
Not here: the row judge (``rowjudge``), the batch itself (``cases.run_batch``).
"""

from __future__ import annotations

import contextlib
import math
import time

from workbook.core import contracts

COST = {"runs": 0, "seconds": 0.0, "engine_starts": 0, "start_seconds": 0.0, "batches": 0}
_FRESH: dict = {}  # engine key -> a reference engine started for fresh slots
TOL = 1e-4
MAX_PAIRS = 4  # neighbours tried beside a victim of a change no contract explains


def reset_cost() -> dict:
    out = dict(COST)
    COST.update(runs=0, seconds=0.0, engine_starts=0, start_seconds=0.0, batches=0)
    return out


def release() -> None:
    """Shut the reference engines started for fresh slots down."""
    for eng in _FRESH.values():
        eng.shutdown()
    _FRESH.clear()


def _free(engine) -> list | None:
    rs = getattr(engine.runner, "req_states", None)
    return getattr(rs, "free_indices", None)


def fresh_slots(engine) -> list[int]:
    """The free slots of ``engine`` no request held while a row check watched it."""
    from workbook.hooks.observe import rowcheck

    free = _free(engine)
    if free is None:
        return []
    used = rowcheck.slot_ledger(engine.runner)
    return sorted(s for s in free if s not in used)


@contextlib.contextmanager
def slots_next(engine, slots: list[int]):
    """The next requests vLLM registers take ``slots`` in order: right before each
    ``add_requests`` (after vLLM has freed the slots of the requests that finished since the
    last step, which it pushes on top of its free-slot stack) those of ``slots`` still free are
    put on top of the stack. An instance attribute shadowing the runner's method for the
    duration (it calls the class's, whatever wraps it then); removed on exit."""
    runner = engine.runner
    free = _free(engine)

    def add_requests(*a, **k):
        for x in reversed(slots):
            if x in free:
                free.remove(x)
                free.append(x)
        return type(runner).add_requests(runner, *a, **k)

    held = runner.__dict__.get("add_requests")  # an enclosing slots_next's
    runner.add_requests = add_requests
    try:
        yield list(slots)
    finally:
        if held is not None:
            runner.add_requests = held
        else:
            del runner.add_requests


def fresh_slot(engine, n: int = 1):
    """``slots_next`` over ``n`` of the engine's never-used free slots."""
    return slots_next(engine, fresh_slots(engine)[:n])


def _engine_for(engine, n: int):
    """``engine`` when it has ``n`` fresh slots, else a reference engine of the same
    configuration (started once; again when its slots are spent)."""
    from workbook.vllm import engine as vengine

    if len(fresh_slots(engine)) >= n:
        return engine, "reused"
    key = vengine.engine_key(engine.cfg)
    ref = _FRESH.get(key)
    if ref is not None and len(fresh_slots(ref)) >= n:
        return ref, "reference"
    if ref is not None:
        ref.shutdown()
    t0 = time.time()
    ref = _FRESH[key] = vengine.start(engine.cfg)
    COST["engine_starts"] += 1
    COST["start_seconds"] += time.time() - t0
    return ref, "fresh"


def _send(engine, cfg, cases: dict, *, zero_head: bool, scale, batch: str, send):
    eng, how = _engine_for(engine, len(cases))
    t0 = time.time()
    with fresh_slot(eng, len(cases)) as slots:
        cells, ev = send(eng, cases, zero_head=zero_head, scale=scale, batch=batch,
                         cfg=cfg.replace(invariance="off", arrival="step0"))
    COST["runs"] += 1
    COST["seconds"] += time.time() - t0
    return cells, ev, slots, how


def _key(rec: dict, row: dict) -> tuple:
    j = row["local_pos"]
    return rec["committed_before"], j, tuple(row.get("drafts") or ())[:j]


def _close(a: float, b: float) -> bool:
    if a == b:
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= TOL * (1 + abs(b))


def compare(batch_ev: dict, alone_ev: dict) -> dict:
    """A request's rows in the batch against the same request alone: the first batch row (in
    step order) whose history the alone run also reached and whose processed value differs at
    a column both kept (where the raw values agree), or whose emitted token differs."""
    alone = {}
    for rec in alone_ev.get("steps") or []:
        for row in rec["rows"]:
            alone.setdefault(_key(rec, row), (rec, row))
    compared = 0
    for rec in batch_ev.get("steps") or []:
        for row in rec["rows"]:
            hit = alone.get(_key(rec, row))
            if hit is None:
                continue
            compared += 1
            arec, arow = hit
            cols = [c for c in sorted(set(row["proc"]) & set(arow["proc"]))
                    if _close(row["raw"][c], arow["raw"][c])
                    and not _close(row["proc"][c], arow["proc"][c])]
            t, ta = row.get("emitted_token"), arow.get("emitted_token")
            raw_off = [c for c in sorted(set(row["raw"]) & set(arow["raw"]))
                       if not _close(row["raw"][c], arow["raw"][c])]
            if not cols and raw_off and t != ta:
                # the forward pass itself differs (vLLM promises no bitwise batch invariance
                # of the model's logits): a token moved by numerics is no processing change
                return {"equal": True, "rows_compared": compared, "raw_differs": {
                    "step": rec["step"], "row": row["row"], "column": raw_off[0],
                    "batch": row["raw"][raw_off[0]], "alone": arow["raw"][raw_off[0]]}}
            if cols or (t is not None and ta is not None and t != ta):
                c = cols[0] if cols else None
                return {"equal": False, "step": rec["step"], "row": row["row"],
                        "local_pos": row["local_pos"], "column": c, "columns": cols[:8],
                        "raw": None if c is None else row["raw"][c],
                        "batch_value": None if c is None else row["proc"][c],
                        "alone_value": None if c is None else arow["proc"][c],
                        "emitted": t, "alone_emitted": ta, "alone_step": arec["step"],
                        "rows_compared": compared}
    return {"equal": True, "rows_compared": compared}


def _slot_text(d: dict) -> str:
    return (f"a fresh slot ({d.get('slot')})" if d.get("fresh") else
            f"slot {d.get('slot')}, which earlier requests held (no fresh slot was taken)")


def _differs_text(d: dict, slot) -> str:
    where = f"step {d['step']}, row {d['row']}"
    if d.get("column") is not None:
        what = (f"column {d['column']} holds {d['batch_value']:.6g} in the batch, "
                f"{d['alone_value']:.6g} alone (raw {d['raw']:.6g} in both)")
    else:
        what = f"the row emitted {d['emitted']} in the batch, {d['alone_emitted']} alone"
    return f"alone on {_slot_text(d)} its rows differ from the batch's at {where}: {what}"


def check(engine, cfg, cases: dict, names: list[str], cells: dict, evidence: dict, *,
          zero_head: bool, scale, batch: str, everyone: bool = False, send=None) -> None:
    """Each request of the batch (``everyone``) — else each whose row check saw a change no
    contract explains — alone on a fresh slot, compared (``cell.alone``); a request that
    held but whose rows differ alone is a victim reported at its first differing row; a change
    no contract explains gets its cause from the neighbours beside it (``name_cause``).
    ``send``: the grid's batch sender (``cases.run_batch``)."""
    COST["batches"] += 1
    todo = [n for n in names if n in evidence and n in cells and (
        everyone or (cells[n].first or {}).get("source") in ("unexplained", "neighbour"))]
    for name in todo:
        got, ev, slots, how = _send(engine, cfg, {name: cases[name]}, zero_head=zero_head,
                                    scale=scale, batch=batch, send=send)
        cell = cells[name]
        d = compare(evidence[name], ev.get(name) or {})
        reg = (ev.get(name) or {}).get("registration") or {}
        d.update(slot=reg.get("slot"), engine=how, fresh=reg.get("slot_seen") == 0,
                 output_alone=(got.get(name).output if got.get(name) else None))
        if d.get("raw_differs"):
            r = d["raw_differs"]
            d["what"] = (f"alone on a fresh slot the raw logits differ from the batch's at step "
                         f"{r['step']}, row {r['row']} (column {r['column']}: {r['batch']:.6g} "
                         f"vs {r['alone']:.6g}): the forward pass, not the request's processing; "
                         "its compared processing agrees")
        elif d["equal"] and cell.output != d["output_alone"] and d["output_alone"] is not None:
            i = contracts.first_divergence(cell.output, d["output_alone"])
            d.update(equal=False, out_index=i, what=(
                f"alone on a fresh slot its output differs from the batch's at output index "
                f"{i} ({d['output_alone'][i] if i is not None and i < len(d['output_alone']) else 'ended'}"
                f" alone), its compared rows equal"))
        elif not d["equal"]:
            d["what"] = _differs_text(d, d["slot"])
        else:
            d["what"] = (f"alone on {_slot_text(d)} its {d['rows_compared']} "
                         "compared rows and its output equal the batch's")
        cell.alone = d
        if not d["equal"]:
            name_cause(engine, cfg, cases, names, cell, evidence, d, zero_head=zero_head,
                       scale=scale, batch=batch, send=send)
        elif cell.first and cell.first.get("source") in ("unexplained", "neighbour"):
            # alone on a fresh slot, with no neighbour, the same change: its own processing
            cell.first["what"] += ("; " + d["what"] + ": the change is the request's own "
                                   "processing (neither the batch nor the slot's history)")
            cell.first.update(source="own", cause=(
                "the request's own processing: alone on a fresh slot the same change"))
            cell.victim = False


def _brings_back(cell, ev, pair_cells, pair_ev) -> bool:
    """Beside one neighbour alone on fresh slots, the request's rows and output equal the
    batch's (the batch's change comes back)."""
    got = pair_cells.get(cell.constraint)
    return compare(ev, pair_ev.get(cell.constraint) or {})["equal"] and (
        got is None or got.output == cell.output)


def _check_leak(cell, ev, names, evidence, cases, d, kw) -> None:
    """A neighbour's contract found on the request's rows (the row judge's leak) checked by the
    one run that separates it from the slot's history: the request beside that neighbour alone,
    both on fresh slots — the change comes back (confirmed) or not (refuted: not the
    neighbour's; the slot's previous occupant or the batch's composition)."""
    rid = cell.first.get("by_request")
    src = next((n for n in names if (evidence.get(n) or {}).get("req_id") == rid), None)
    if src is None:
        cell.first["what"] += f"; {d['what']} (the batch or the slot's history)"
        return
    got, pev, _slots, _how = _send(kw.pop("engine"), kw.pop("cfg"),
                                   {cell.constraint: cases[cell.constraint], src: cases[src]},
                                   **kw)
    if _brings_back(cell, ev, got, pev):
        cell.first["what"] += (f"; {d['what']}; beside {src} alone on fresh slots the change "
                               "comes back: confirmed")
        return
    prev = ((ev.get("registration") or {}).get("previous") or {}).get("req_id")
    if prev:  # what the slot held when the request was registered there
        cell.first["stage"] = "registration"
    cell.first.update(source="previous occupant" if prev else "unexplained",
                      by_request=prev, cause=(
                          f"not request {rid}'s: beside it alone on fresh slots the change does "
                          "not come back; " + (f"the slot's previous occupant {prev}" if prev
                                               else "the batch's composition or the slot's history")))
    cell.first["what"] += (f"; {d['what']}; beside {src} alone on fresh slots the change does not "
                           "come back: not its constraint (" + (
                               f"the slot's previous occupant {prev}" if prev else
                               "the batch's composition or the slot's history") + ")")


def _unexplained(cell) -> bool:
    return bool(cell.first) and cell.first.get("source") == "unexplained"


def name_cause(engine, cfg, cases, names, cell, evidence, d: dict, **kw) -> None:
    """The cause of a victim's change, from evidence: its row breach's source when the row
    judge named one (a neighbour's contract, the slot's previous occupant — confirmed here by
    the request alone); for a change no contract explains, the neighbours present at the first
    changed step, each sent beside the request alone on fresh slots: the ones whose presence
    brings the change back. A request that held is a victim reported at its first differing
    row."""
    if cell.status == "holds":
        cell.status, cell.victim, cell.breaches = "violated", True, cell.breaches + 1
        cell.first = {"step": d["step"], "row": d["row"], "local_pos": d["local_pos"],
                      "stage": "apply" if d.get("column") is not None else "sampling",
                      "contract": "unexplained change", "column": d.get("column"),
                      "out_index": d.get("out_index"), "source": "unexplained",
                      "what": f"its own contracts held, yet {d['what']}"}
    ev = evidence.get(cell.constraint) or {}
    if cell.first and cell.first.get("source") == "neighbour":
        _check_leak(cell, ev, names, evidence, cases, d, {"engine": engine, "cfg": cfg, **kw})
        return
    if not _unexplained(cell):
        if cell.first:
            cell.first["what"] += "; " + d["what"] + " (confirmed: the batch or the slot's history)"
        return
    step = cell.first.get("step")
    present = [n for n in names if n != cell.constraint and any(
        s["step"] == step for s in (evidence.get(n) or {}).get("steps") or [])]
    triggers, quiet = [], []
    for n in present[:MAX_PAIRS]:
        pair = {cell.constraint: cases[cell.constraint], n: cases[n]}
        got, pev, _slots, _how = _send(engine, cfg, pair, **kw)
        dd = compare(ev, pev.get(cell.constraint) or {})
        # beside n alone, rows and output equal the batch's: n's presence brings it back
        differs = not dd["equal"] or (got.get(cell.constraint) is not None and
                                      got[cell.constraint].output != cell.output)
        (quiet if differs else triggers).append(n)
    d["pairs"] = {"brings it back": triggers, "no change beside": quiet,
                  "not tried": present[MAX_PAIRS:]}
    if triggers:
        src = (f"beside {', '.join(triggers)} alone the batch's change comes back"
               + (f"; beside {', '.join(quiet)} it does not" if quiet else ""))
        cell.first.update(source="neighbour presence", by_request=triggers,
                          cause=f"the presence of {', '.join(triggers)} in the batch")
    else:
        src = ("no single neighbour brings it back beside it (" + (", ".join(quiet) or "none")
               + "): the step's composition or the slot's history")
        cell.first["cause"] = "the batch's composition or the slot's history (not one neighbour)"
    cell.first["what"] += f"; {d['what']}: the batch changed it; {src}"
