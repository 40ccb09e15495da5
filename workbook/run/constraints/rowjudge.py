"""Judging the row check's evidence (``workbook.hooks.observe.rowcheck``): per logits row, every kept
column's processed value against what the request's contracts predict from its raw value
(``contracts.expected``; a column no contract changes must stay raw), so a change in a column the
contract does not name is as much a violation as a wrong value in one it names. The first row
whose processed values differ is the first violation, with the column and both values.

Attribution: in a batch, a row of request B that breaks B's prediction where every differing
value is what another request A's contract gives at that column (A's ``expected`` applied to B's
raw value, or to B's own prediction), A's transform actually changing it, is A's constraint
leaking: a breach of A's contract ("request A's <constraint> applied to request B's row ...");
B keeps it as ``affected_by`` and is not violated by it. Never by elimination, and not once B
broke that same contract on its own rows (its later values of it then follow from its own wrong
state: a neighbour's prediction matching them is no evidence of a leak).

Rows that can never be used are not judged (``unreachable_rows``): a draft row stands for its
earlier drafts accepted, and a draft other than the column the budget forces at its own row is
rejected with certainty (``contracts.unreachable``) — unless the evidence shows a token emitted
from the row after all (an acceptance that should not have happened): then it is judged.

Stages: the one list (``workbook.core.stages``), named from positive evidence only:
registration, gate, device state (the committed history the row was processed with), apply,
apply on draft rows (``stage``), sampling and acceptance (``rejection``: the emitted token
breaks its processed row — its own sample, or an accepted draft); the rest are judged in
``workbook.run.constraints.cases``. Each request's contracts come back as well in the one verdict
shape (``verdicts.Verdict``, ``records``). Not here: gathering (the hook), the contracts
themselves.
"""

from __future__ import annotations

import dataclasses
import math

from workbook.core import budget, contracts
from workbook.core.stages import NAMES as STAGES  # noqa: F401 (the one list, re-exported)
from workbook.run.verdicts import Verdict, touched_by


def judge(rc, names: dict[str, str] | None = None) -> dict[str, dict]:
    """``judge_steps`` over a ``RowCheck``'s materialized evidence."""
    return judge_steps(rc.steps, rc.params, rc.prompts, rc.registrations, rc.markers, names)


def judge_steps(steps: list[dict], params: dict, prompts: dict, registrations: list[dict],
                markers: budget.Markers, names: dict[str, str] | None = None
                ) -> dict[str, dict]:
    """Per request: rows checked, breaches (step, row, local position, output index, stage,
    contract, what, column, expected — a forced column's lower bound —, found, columns: how many
    differ in that row), the first,
    and ``affected_by`` (another request's constraint found on its rows). ``names``: request id
    -> the label sentences use (default: the id)."""
    label = lambda r: (names or {}).get(r, r)
    regs = {r["req_id"]: r for r in registrations}
    before: dict[int, tuple] = {}  # id(rec) -> committed output before the step
    by_step: dict[int, list[dict]] = {}
    seen: dict[str, tuple] = {}
    for rec in steps:
        before[id(rec)] = seen.get(rec["req_id"], ())
        seen[rec["req_id"]] = before[id(rec)] + tuple(rec["emitted"])
        by_step.setdefault(rec["step"], []).append(rec)
    out: dict[str, dict] = {}

    def res(req_id):
        return out.setdefault(req_id, {"rows": 0, "draft_rows": 0, "unreachable_rows": 0,
                                       "breaches": [], "affected_by": [],
                                       "constraints": params[req_id].constraints()})

    broken: dict[str, set] = {}  # request -> contracts it already broke on its own rows
    for rec in steps:
        req_id = rec["req_id"]
        if req_id not in params:
            continue
        p, r = params[req_id], res(req_id)
        reg = regs.get(req_id)
        if reg is not None and reg.get("unasked") and "registration" not in r:
            # state in its slot it did not ask for: a breach only where a row it processed
            # changed (then the stage of that row's breach); else a note on the cell
            r["registration"] = registration_text(req_id, reg, label)
        row0_ok = True
        for row in rec["rows"]:
            j = row["local_pos"]
            ctx = _ctx(prompts[req_id], before[id(rec)], row, j, markers, p)
            if j > 0 and row.get("emitted_token") is None and \
                    contracts.unreachable(p, ctx) is not None:
                r["unreachable_rows"] += 1  # an earlier draft contradicts a forced column and
                continue                    # nothing was emitted here: a row never used
            r["rows"] += 1
            r["draft_rows"] += j > 0
            found = contracts.check_row(p, ctx, row["raw"], row["proc"], row["finite"])
            cols = [b for b in found if b.column is not None]
            src = _source(req_id, row, ctx, cols, by_step[rec["step"]], params, prompts,
                          before, markers, reg) if cols else None
            if src is not None and src[1] in broken.get(req_id, ()):
                # B already broke this contract on its own rows: its later values of it follow
                # from its own wrong state and cannot be told from A's (no leak claimed)
                src = None
            st_here = _draft_aware("apply", j, row0_ok)
            if src is not None:
                a, name, col, exp, got, kind = src
                at = {"step": rec["step"], "row": row["row"], "local_pos": j,
                      "column": col, "out_index": ctx.out_index, "expected": exp,
                      "found": got, "columns": len(cols)}
                if kind == "previous":
                    what = (f"request {label(a)}'s {name}, left in slot {reg.get('slot')} when "
                            f"it finished, applied to request {label(req_id)}'s row at step "
                            f"{rec['step']}, row {row['row']}: column {col} expected "
                            f"{exp:.6g} by request {label(req_id)}'s contracts, found "
                            f"{got:.6g}, what request {label(a)}'s {name} gives there"
                            + _unasked_text(reg))
                    r["breaches"].append({**at, "stage": "registration", "contract": name,
                                          "what": what, "source": "previous occupant",
                                          "by_request": a, "by_name": label(a)})
                else:
                    what = (f"request {label(a)}'s {name} applied to request {label(req_id)}'s "
                            f"row at step {rec['step']}, row {row['row']}: column {col} "
                            f"expected {exp:.6g} by request {label(req_id)}'s contracts, found "
                            f"{got:.6g}, what request {label(a)}'s {name} gives there")
                    # the victim's breach (its rows changed); the source's own rows held
                    r["breaches"].append({**at, "stage": st_here, "contract": name,
                                          "what": what, "source": "neighbour",
                                          "by_request": a, "by_name": label(a)})
                r["affected_by"].append({**at, "stage": st_here, "contract": name,
                                         "what": what, "by_request": a, "by_name": label(a)})
                found = [b for b in found if b.column is None]
            unexpl = [] if src is not None else [
                b for b in found if b.column is not None and b.column in row["raw"]
                and not contracts.expected(p, ctx, b.column, row["raw"][b.column]).by
                and own_transform(p, ctx, b.column, row["raw"][b.column],
                                  row["proc"][b.column], row) is None]
            found = [_owned(p, ctx, b, row) for b in found]
            if unexpl:
                found = [b for b in found if b not in unexpl]
                r["breaches"].append(_unexplained(req_id, rec, row, ctx, unexpl, reg, p,
                                                  by_step[rec["step"]], params, label,
                                                  "registration" if reg and reg.get("unasked")
                                                  else st_here))
            marked = [(b, stage(reg, row, j, row0_ok, p, ctx)) for b in _per_contract(
                found)] if found else []
            if not marked and src is None and not unexpl:
                marked = rejection(p, ctx, row)
            if j == 0:
                row0_ok = not marked and src is None and not unexpl
            for b, st in marked:
                broken.setdefault(req_id, set()).add(b.contract)
                d = {"step": rec["step"], "row": row["row"], "local_pos": j, "stage": st,
                     "source": "own", **b.to_dict()}
                off = counts_off(row, ctx) if st == "device state" else None
                if off is not None:
                    d["what"] += (f"; vLLM's penalty counts hold {off[1]} at column {off[0]} "
                                  f"where request {label(req_id)}'s own output holds {off[2]}"
                                  f" — {_previous_text(reg, label)}" if reg else "")
                if b.column is not None and b.column in row["raw"]:
                    e = contracts.expected(p, ctx, b.column, row["raw"][b.column])
                    d.update(expected=_value(e), found=row["proc"][b.column],
                             columns=sum(1 for x in found if x.contract == b.contract))
                r["breaches"].append(d)
    for req_id, r in out.items():
        r["breaches"].sort(key=lambda b: (b["step"], b["row"]))
        for b in r["breaches"]:
            b["cause"] = cause_of(b)
        r["first"] = r["breaches"][0] if r["breaches"] else None
        # its own contracts held, its rows changed by another request or by the slot's
        # history: a victim (reported at its first changed row, never among the holds)
        r["victim"] = bool(r["breaches"]) and all(b.get("source") not in (None, "own")
                                                  for b in r["breaches"])
        r["verdicts"] = records(req_id, r, label)
    return out


UNCONSTRAINED = "no constraint"  # the contract of a request that asked for none


def records(req_id: str, r: dict, label=lambda x: x) -> list[dict]:
    """One request's row judgement in the one verdict shape (``verdicts.Verdict``): per
    contract judged on its rows (``Contract.on_rows``; the output's are
    ``workbook.run.constraints.cases``'), violated (its first breach: step, row, column, stage, the sentence; a
    leak onto another request's row says so as its cause) or held; ``affected_by``: another
    request's constraint found on this request's rows."""
    touched = touched_by(r.get("affected_by"))
    out = []
    names = [n for n in r["constraints"] if _on_rows(n)]  # judged here: those on the rows
    names += list(dict.fromkeys(b["contract"] for b in r["breaches"] if b.get("contract")
                                not in names))
    if not names and touched:  # no contract of its own: its rows must stay raw
        out.append(Verdict(req_id, UNCONSTRAINED, "held", evidence=(
            f"no constraint asked for: its {r['rows']} rows stayed raw but where another "
            "request's constraint reached them"), affected_by=touched).to_dict())
    for name in names:
        b = next((b for b in r["breaches"] if b.get("contract") == name), None)
        if b is None:
            out.append(Verdict(req_id, name, "held", evidence=(
                f"{name} held at {r['rows']} rows ({r['draft_rows']} draft rows)"),
                affected_by=touched).to_dict())
            continue
        out.append(Verdict(
            req_id, name, "violated", step=b.get("step"), row=b.get("row"),
            local_pos=b.get("local_pos"), column=b.get("column"),
            output_index=b.get("out_index"), stage=b.get("stage"), cause=cause_of(b),
            evidence=b.get("what") or "", affected_by=touched).to_dict())
    return out


def own_transform(p, ctx, col: int, raw: float, got: float, row: dict | None = None
                  ) -> str | None:
    """The request's own contract whose transform gives ``got`` at a column it should have left
    alone — its stage applied it to the wrong column: a penalty as if the column were in the
    history (1-4 times, with vLLM's device count, or in the prompt), a mask (``-inf``) at a
    column one of its masking contracts names (an allowed id, a bad word's last token, a stop
    id under min_tokens).
    None: no contract of this request produces that value (an unexplained change)."""
    dev = (row or {}).get("counts") or {}
    ks = list(dict.fromkeys([*range(1, 5), *([int(dev[col]) - ctx.output.count(col)]
                                             if dev.get(col) else [])]))
    for k in (k for k in ks if k > 0):
        for cx in (contracts.RowContext(ctx.prompt, tuple(ctx.output) + (col,) * k, ctx.drafts,
                                        ctx.local_pos, ctx.markers),
                   contracts.RowContext(tuple(ctx.prompt) + (col,) * k, ctx.output,
                                        ctx.drafts, ctx.local_pos, ctx.markers)):
            for q in _parts(p):
                e = contracts.expected(q, cx, col, raw)
                if e.by and not e.forced and contracts.close(got, e.value):
                    return e.by[-1]
    if got == float("-inf"):  # a masking contract's own columns only
        own = {"allowed_token_ids": set(p.allowed_token_ids or ()),
               "bad_words": {w[-1] for w in p.bad_words if w},
               "min_tokens": set(p.masked_by_min_tokens) if p.min_tokens else set()}
        return next((n for n, cols in own.items() if col in cols and n in p.constraints()),
                    None)
    return None


def _parts(p):
    """The request's parameters, then each of its penalties alone (the penalties stage applies
    three transforms; one of them on a wrong column is still that stage's)."""
    out = [p]
    if p.penalised:
        neutral = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        for keep in neutral:
            if getattr(p, keep) != neutral[keep]:
                out.append(dataclasses.replace(p, **{k: v for k, v in neutral.items()
                                                     if k != keep}))
    return out


def _owned(p, ctx, b, row):
    """A breach at a column none of the request's contracts names, booked against the own
    contract whose transform gives the found value there (``own_transform``)."""
    if b.column is None or b.column not in row["raw"]:
        return b
    e = contracts.expected(p, ctx, b.column, row["raw"][b.column])
    if e.by:
        return b
    name = own_transform(p, ctx, b.column, row["raw"][b.column], row["proc"][b.column], row)
    return b if name is None else contracts.Breach(name, b.what, b.column, b.out_index)


def cause_of(b: dict) -> str | None:
    """A row breach's named source, from its evidence (None: the request's own state)."""
    src = b.get("source")
    if src == "neighbour":
        return f"request {b.get('by_name')}'s {b.get('contract')} applied to this request's row"
    if src == "previous occupant":
        return (f"request {b.get('by_name')}'s {b.get('contract')} left in the slot it had "
                "occupied")
    if src == "unexplained":
        return "not separated by the row evidence: " + ("; ".join(
            x for x in (f"present in the batch: {', '.join(b.get('present') or []) or 'none'}",
                        f"the slot's previous occupant: {b['previous']}" if b.get("previous")
                        else None) if x))
    return None


def _on_rows(name: str) -> bool:
    try:
        return contracts.get(name).on_rows
    except (KeyError, ValueError):
        return False


def _ctx(prompt, before, row, j, markers, p=None) -> contracts.RowContext:
    ctx = contracts.RowContext(tuple(prompt), tuple(before), tuple(row["drafts"]), j, markers)
    if p is not None and p.min_tokens > 0 and p.json_schema is not None:
        # min_tokens with structured output: is the grammar's end all the raw row has left?
        # (the raw row's kept columns hold its top-K: contracts.masks.stop_only)
        from workbook.hooks.observe.rowcheck import TOP_K
        from workbook.core.contracts.masks import stop_only
        ctx = dataclasses.replace(ctx, stop_only=stop_only(p, ctx, row["raw"], TOP_K))
    return ctx


def _value(e: contracts.Expect) -> float:
    """The value a column must hold (a forced column: at least ``budget.FORCED_LOGIT``)."""
    return budget.FORCED_LOGIT if e.forced else e.value


def _per_contract(found: list) -> list:
    """The first breach of each contract in the row (the kept columns' order)."""
    first: dict[str, contracts.Breach] = {}
    for b in found:
        first.setdefault(b.contract, b)
    return list(first.values())


def _draft_aware(name: str, j: int, row0_ok: bool) -> str:
    return f"{name} on draft rows" if j > 0 and row0_ok else name


def stage(reg: dict | None, row: dict, j: int, row0_ok: bool, p, ctx=None) -> str:
    """The stage a row breach belongs to, from positive evidence: ``registration`` (vLLM's
    per-slot state after ``add_request`` lacks the parameter), ``gate`` (the slot's
    gate off, or ``apply_sampling_params`` returned its input), ``device state`` (the device
    history the row was processed with differs from the tokens emitted before), else ``apply``
    (``apply on draft rows`` when row 0 of the same step held)."""
    if reg is not None and set(reg["missing"]) - {"gate"}:
        return "registration"
    if contracts.gated(p) and (row["gate"] is False or row["fast_path"]):
        return "gate"
    if not row["history_ok"] or counts_off(row, ctx) is not None:
        return "device state"
    return _draft_aware("apply", j, row0_ok)


def counts_off(row: dict, ctx) -> tuple[int, int, int] | None:
    """vLLM's penalty counts the row was processed with (``row['counts']``, kept when a
    request is penalised) against the request's own committed output: the first column where
    they differ, ``(column, device count, own count)``; None when they agree or were not kept."""
    counts = row.get("counts") if ctx is not None else None
    for c, n in sorted((counts or {}).items()):
        own = list(ctx.output).count(c)
        if int(n) != own:
            return c, int(n), own
    return None


def rejection(p, ctx, row) -> list:
    """A processed row that held but an emitted token that breaks it: masked there, or (greedy)
    not the processed row's argmax. Stage ``acceptance`` when the token is the draft the
    rejection sampler accepted at that row (the next row's input), else ``sampling`` (the
    row's own sample)."""
    t = row["emitted_token"]
    if t is None:
        return []
    j, drafts = row["local_pos"], row.get("drafts") or []
    st = "acceptance" if j < len(drafts) and drafts[j] == t else "sampling"
    b = contracts.must_hold_token(p, ctx, t)
    if b is not None:
        return [(b, st)]
    if p.temperature == 0.0 and "proc_at_emitted" in row:
        if row["proc_at_emitted"] < row["top1_val"] and t != row["top1"]:
            return [(contracts.Breach("greedy", f"emitted {t} ({row['proc_at_emitted']:.6g})"
                                      f", the processed row's argmax is {row['top1']} "
                                      f"({row['top1_val']:.6g})", t, ctx.out_index),
                     st)]
    return []


def _source(req_id, row, ctx, cols, peers, params, prompts, before, markers, reg=None):
    """What explains every differing column of this row, from positive evidence: the slot's
    previous occupant whose parameters vLLM's registration still holds for this request —
    a setting it did not ask for (``reg['unasked']``) whose owner's contract gives every found
    value, or a setting it asked for whose values are the previous occupant's (this request's
    parameters with that setting's fields the previous occupant's give every processed value:
    ``SLOT_FIELDS``) —, else another request of the step whose contract does. ``(request,
    contract, column, expected, found, kind)`` for the first column (``kind``: ``previous`` or
    ``neighbour``), or None."""
    p = params[req_id]
    prev = (reg or {}).get("previous")
    left = {u["setting"] for u in (reg or {}).get("unasked") or []}
    if prev and prev.get("params"):
        pa = contracts.Params(**prev["params"])
        c = cols[0].column
        e = contracts.expected(p, ctx, c, row["raw"][c])
        if left:  # a setting it did not ask for, left by the previous occupant
            names = [_explains(pa, ctx, p, ctx, b.column, row) for b in cols]
            if all(n in left for n in names):
                return prev["req_id"], names[0], c, _value(e), row["proc"][c], "previous"
        for name, fields in SLOT_FIELDS.items():  # a setting it asked for, with the old values
            if name not in p.constraints() or name not in pa.constraints() or all(
                    getattr(p, f) == getattr(pa, f) for f in fields):
                continue
            mixed = dataclasses.replace(p, **{f: getattr(pa, f) for f in fields})
            if all(_gives(mixed, ctx, b.column, row) for b in cols):
                return prev["req_id"], name, c, _value(e), row["proc"][c], "previous"
    for rec in peers:
        a = rec["req_id"]
        if a == req_id or a not in params:
            continue
        pa = params[a]
        rows_a = rec["rows"]
        j_a = min(row["local_pos"], max(0, len(rows_a) - 1))
        ctx_a = _ctx(prompts[a], before[id(rec)], rows_a[j_a], j_a, markers) if rows_a else ctx
        for cx in dict.fromkeys((ctx, ctx_a)):
            names = [_explains(pa, cx, p, ctx, b.column, row) for b in cols]
            if all(names):
                c = cols[0].column
                e = contracts.expected(p, ctx, c, row["raw"][c])
                return a, names[0], c, _value(e), row["proc"][c], "neighbour"
    return None


UNEXPLAINED = "unexplained change"  # the verdict of a change no contract of the request explains
# the request parameters vLLM's add_request writes into a slot's state, per setting
SLOT_FIELDS = {"allowed_token_ids": ("allowed_token_ids",), "logit_bias": ("logit_bias",),
               "bad_words": ("bad_words",), "min_tokens": ("min_tokens", "stop_token_ids"),
               "penalties": ("repetition_penalty", "presence_penalty", "frequency_penalty"),
               "thinking_token_budget": ("thinking_token_budget",)}


def _gives(q, ctx, col: int, row: dict) -> bool:
    """Whether parameters ``q`` predict the row's processed value at ``col``."""
    e = contracts.expected(q, ctx, col, row["raw"][col])
    got = row["proc"][col]
    return got >= budget.FORCED_LOGIT if e.forced else contracts.close(got, e.value)


def registration_text(req_id, reg: dict, label=lambda x: x) -> str:
    """The registration check's other way, as a sentence: the settings vLLM holds for the
    request that it did not ask for, the slot, and the request that left them there."""
    parts = ", ".join(f"{u['field']} {_num(u['found'])} (asked {_num(u['asked'])})"
                      for u in reg.get("unasked") or [])
    return (f"registration: slot {reg.get('slot')} holds {parts} for request {label(req_id)}, "
            f"which did not ask for {', '.join(dict.fromkeys(u['setting'] for u in reg['unasked']))}"
            f"; {_previous_text(reg, label)}")


def _previous_text(reg: dict, label=lambda x: x) -> str:
    prev = (reg or {}).get("previous")
    if prev is None:
        return (f"the slot's earlier occupants were not seen by the row check "
                f"({reg.get('slot_seen', 0)} registration(s) in it seen)")
    return (f"the slot's previous occupant: request {label(prev['req_id'])} "
            f"({', '.join(prev.get('constraints') or []) or 'no constraint'})")


def _unasked_text(reg: dict | None) -> str:
    if not reg or not reg.get("unasked"):
        return ""
    return "; its registration holds " + ", ".join(
        f"{u['field']} {_num(u['found'])}" for u in reg["unasked"]) + " it did not ask for"


def _num(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _unexplained(req_id, rec, row, ctx, breaches, reg, p, peers, params, label, st) -> dict:
    """A change no contract of this request explains (a column none of its contracts touches
    differs from raw), and no neighbour's or earlier occupant's contract gives it: its own
    verdict (``UNEXPLAINED``), never booked against a contract that held. The sentence says the
    change, the emitted token there, who was present in the batch and what the slot held —
    the candidates, and the check that separates them (the request alone on a fresh slot,
    ``workbook.run.constraints.invariance``)."""
    b0 = breaches[0]
    c = b0.column
    raw, got = row["raw"][c], row["proc"][c]
    how = ("masked" if got == float("-inf") else "raised" if got > raw else "lowered")
    delta = "" if not (math.isfinite(got) and math.isfinite(raw)) else \
        f" by {got - raw:+.6g}"
    others = [f"{label(x['req_id'])} ({', '.join(params[x['req_id']].constraints()) or 'no constraint'})"
              for x in peers if x["req_id"] != req_id and x["req_id"] in params]
    t = row.get("emitted_token")
    emitted = "" if t is None else (f"; the row emitted {t}" + (" (the changed column)"
                                                                if t == c else ""))
    what = (f"changed where no constraint of request {label(req_id)} applies: column {c} "
            f"{how}{delta} ({raw:.6g} -> {got:.6g}) at step {rec['step']}, row {row['row']}"
            + (f" ({len(breaches)} columns changed)" if len(breaches) > 1 else "") + emitted
            + f" — present in the batch: {'; '.join(others) or 'no other request'}"
            + (f"; {registration_text(req_id, reg, label)}" if reg and reg.get("unasked")
               else f"; {_previous_text(reg, label)}" if reg else "")
            + "; none of their contracts gives these values: the request alone on a fresh "
              "slot (the batch-invariance reference) separates the batch from the slot's "
              "history")
    return {"step": rec["step"], "row": row["row"], "local_pos": row["local_pos"],
            "stage": st, "contract": UNEXPLAINED, "what": what, "column": c,
            "out_index": ctx.out_index, "expected": raw, "found": got,
            "columns": len(breaches), "source": "unexplained",
            "present": [x["req_id"] for x in peers if x["req_id"] != req_id],
            "previous": ((reg or {}).get("previous") or {}).get("req_id")}


def _explains(pa, cx, p, ctx, col: int, row: dict) -> str | None:
    """The contract of ``pa`` whose transform gives the found value at ``col`` (applied to the
    raw value, or after this request's own prediction), and changes it; else None."""
    raw, got = row["raw"][col], row["proc"][col]
    own = contracts.expected(p, ctx, col, raw)
    tries = [(contracts.expected(pa, cx, col, raw), raw)]
    if not own.forced and math.isfinite(own.value):
        tries.append((contracts.expected(pa, cx, col, own.value), own.value))
    for e, base in tries:
        if not e.by:
            continue
        if e.forced and got >= budget.FORCED_LOGIT and not own.forced:
            return e.by[-1]
        if not e.forced and contracts.close(got, e.value) and not contracts.close(e.value, base):
            return e.by[-1]
    return None
