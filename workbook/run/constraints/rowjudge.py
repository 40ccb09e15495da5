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
            leak = _source(req_id, row, ctx, cols, by_step[rec["step"]], params, prompts,
                           before, markers) if cols else None
            if leak is not None and leak[1] in broken.get(req_id, ()):
                # B already broke this contract on its own rows: its later values of it follow
                # from its own wrong state and cannot be told from A's (no leak claimed)
                leak = None
            leak_stage = _draft_aware("apply", j, row0_ok)
            if leak is not None:
                a, name, col, exp, got = leak
                what = (f"request {label(a)}'s {name} applied to request {label(req_id)}'s row "
                        f"at step {rec['step']}, row {row['row']}: column {col} expected "
                        f"{exp:.6g} by request {label(req_id)}'s contracts, found {got:.6g}, "
                        f"what request {label(a)}'s {name} gives there")
                at = {"step": rec["step"], "row": row["row"], "local_pos": j, "stage": leak_stage,
                      "contract": name, "what": what, "column": col, "out_index": ctx.out_index,
                      "expected": exp, "found": got, "columns": len(cols)}
                res(a)["breaches"].append({**at, "on_request": req_id,
                                           "on_name": label(req_id)})
                r["affected_by"].append({**at, "by_request": a, "by_name": label(a)})
                found = [b for b in found if b.column is None]
            marked = [(b, stage(regs.get(req_id), row, j, row0_ok, p)) for b in _per_contract(
                found)] if found else []
            if not marked and leak is None:
                marked = rejection(p, ctx, row)
            if j == 0:
                row0_ok = not marked and leak is None
            for b, st in marked:
                broken.setdefault(req_id, set()).add(b.contract)
                d = {"step": rec["step"], "row": row["row"], "local_pos": j, "stage": st,
                     **b.to_dict()}
                if b.column is not None and b.column in row["raw"]:
                    e = contracts.expected(p, ctx, b.column, row["raw"][b.column])
                    d.update(expected=_value(e), found=row["proc"][b.column],
                             columns=sum(1 for x in found if x.contract == b.contract))
                r["breaches"].append(d)
    for req_id, r in out.items():
        r["breaches"].sort(key=lambda b: (b["step"], b["row"]))
        r["first"] = r["breaches"][0] if r["breaches"] else None
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
        leak = b.get("on_request")
        out.append(Verdict(
            req_id, name, "violated", step=b.get("step"), row=b.get("row"),
            local_pos=b.get("local_pos"), column=b.get("column"),
            output_index=b.get("out_index"), stage=b.get("stage"),
            cause=None if leak is None else
            f"request {label(req_id)}'s {name} applied to request {b.get('on_name')}'s row",
            evidence=b.get("what") or "", affected_by=touched).to_dict())
    return out


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


def stage(reg: dict | None, row: dict, j: int, row0_ok: bool, p) -> str:
    """The stage a row breach belongs to, from positive evidence: ``registration`` (vLLM's
    per-slot state after ``add_request`` lacks the parameter), ``gate`` (the slot's
    gate off, or ``apply_sampling_params`` returned its input), ``device state`` (the device
    history the row was processed with differs from the tokens emitted before), else ``apply``
    (``apply on draft rows`` when row 0 of the same step held)."""
    if reg is not None and set(reg["missing"]) - {"gate"}:
        return "registration"
    if row["gate"] is False or row["fast_path"]:
        return "gate"
    if not row["history_ok"]:
        return "device state"
    return _draft_aware("apply", j, row0_ok)


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


def _source(req_id, row, ctx, cols, peers, params, prompts, before, markers):
    """The other request of the step whose contract explains every differing column of this
    row: ``(request, contract, column, expected, found)`` for the first column, or None."""
    p = params[req_id]
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
                return a, names[0], c, _value(e), row["proc"][c]
    return None


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
