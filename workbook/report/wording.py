"""One wording per fact: how the report and the notebooks say a value that is absent.

Every place that shows a run's facts (the report's tables and finding, the notebooks' tables
and headings, ``workbook run``'s last lines) says an absent value the same way, with a
sentence where a table would be empty — never ``None``, ``NaN``, ``null`` or an empty table.

- ``DASH``: a table cell whose column does not apply to the row (e.g. "first violation" of an
  honoured run); the column's caption says what the dash means.
- ``NOT_RECORDED``: a fact the evidence files do not hold (e.g. vLLM's commit in a build that
  does not record it) — the same words in every table.
- ``budget_text(b)``: a request's budget, an integer, or "no budget".
- ``value_text(v)``: any value for a sentence or a cell (``NOT_RECORDED`` for None / NaN,
  integers without ".0", yes / no for booleans).
- ``verdict_heading(v)``: the verdict's one-line heading: "honored — the budget held in every
  request" rather than "honored — None".
- ``violation_text(fv, label)``: a first violation in one sentence per kind (missing / early /
  unbudgeted / twice): "expected </think> at output index 4, emitted 'x'", "</think> forced at
  output index 3 before the budget bound (budget 5)", "... forced into a request without a
  budget", "... forced twice" — the forced kinds have no expected token, and say none.
- ``guard_text(g)``: what the guard did in a run (``verdict["guard"]``): "the guard fixed N
  tokens, repaired M fields of its own state (...)" or "the guard changed nothing (...)".

- ``said(text)``: a sentence recorded by an earlier diagnosis, with any Python repr in it
  (``{'start': [248068], ...}``, ``[0, 0, 0]``, ``None``) said in words;
  ``said_verdict(v)`` applies it to every sentence of a verdict (summary, reason, causes,
  chain, anomalies).

Not here: judging anything (``workbook.run.budget.diagnose``), HTML (``workbook.report.page``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

DASH = "—"
NOT_RECORDED = "not recorded"
NO_BUDGET = "no budget"


def absent(v: Any) -> bool:
    """None, NaN / NaT, or a string that only says so."""
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    try:
        import pandas as pd

        if v is pd.NA or v is pd.NaT:
            return True
    except ImportError:  # pragma: no cover
        pass
    return isinstance(v, str) and v.strip() in ("", "nan", "NaN", "None", "null", "<NA>")


def value_text(v: Any, missing: str = NOT_RECORDED) -> str:
    if absent(v):
        return missing
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    return str(v)


def budget_text(b: Any) -> str:
    """A request's budget: ``3`` (never ``3.0``), or "no budget" (None, NaN, -1)."""
    if absent(b):
        return NO_BUDGET
    try:
        n = int(b)
    except (TypeError, ValueError):
        return str(b)
    return NO_BUDGET if n == -1 else str(n)


def verdict_heading(v: dict | None) -> str:
    """``honored — <what held>`` / ``violated — H-x: title`` / ``inconclusive — why``."""
    v = v or {}
    verdict = v.get("verdict")
    if absent(verdict):
        return "no verdict — the run recorded none (see its failure)"
    hyp = v.get("hypothesis")
    if not absent(hyp):
        title = v.get("hypothesis_title")
        return f"{verdict} — {hyp}" + (f": {title}" if not absent(title) else "")
    if verdict == "honored":
        n = len(v.get("requests") or [])
        text = said(v.get("summary"))
        return (f"honored — {text}" if not absent(text) else
                "honored — every request ended its reasoning where the budget puts it") + \
            (f" ({n} request{'s' if n != 1 else ''} judged)" if n else "")
    if verdict == "violated":
        return "violated — no cause named (unclassified: see the anomalies)"
    return f"{verdict} — {value_text(said(v.get('summary')), 'no summary recorded')}"


KINDS = ("missing", "early", "unbudgeted", "twice")


def _tok(label, tok, missing: str) -> str:
    return missing if absent(tok) else label(tok)


def violation_text(fv: dict | None, label=None) -> str:
    """A first violation (``verdict["first_violation"]``) as one sentence, by its ``kind``;
    ``label(token id) -> str`` names a token (default: the id)."""
    fv = fv or {}
    label = label or (lambda t: value_text(t))
    kind = fv.get("kind") if fv.get("kind") in KINDS else "missing"
    at = ("at an unrecorded output index" if absent(fv.get("output_index"))
          else f"at output index {value_text(fv.get('output_index'))}")
    emitted = _tok(label, fv.get("emitted_token"), "the end marker")
    b = fv.get("budget")
    if kind == "early":
        return (f"{emitted} forced {at} before the budget bound "
                f"(budget {budget_text(b)})")
    if kind == "unbudgeted":
        return f"{emitted} forced {at} into a request without a budget"
    if kind == "twice":
        return (f"{emitted} forced twice: again {at}, after reasoning had "
                f"already ended ({'no budget' if absent(b) else 'budget ' + budget_text(b)})")
    expected = _tok(label, fv.get("expected_token"), "the end marker")
    return (f"expected {expected} {at}, emitted "
            f"{_tok(label, fv.get('emitted_token'), 'no token (the output ended)')}")


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def guard_text(g: dict | None) -> str:
    """What the guard did in one run, from ``verdict["guard"]`` (``workbook.run.pipeline``):
    every repair counted, the fields and requests named."""
    if not g:
        return ("the guard was on, but this run's verdict holds no guard report (written "
                "before the guard reported its repairs)")
    if g.get("available") is False:
        return ("the guard ran in the server's worker process; its repairs are not in this "
                "run's files (" + value_text(g.get("why"), "no reason recorded") + ")")
    if not g.get("installed") or g.get("enabled") is False:
        return "the guard was asked for but did not run on this engine (not installed or " \
               "not enabled): it changed nothing because it never ran"
    steps = int(g.get("guarded_steps") or 0)
    fixed = int(g.get("fixed_tokens") or 0)
    fields = int(g.get("repaired_fields") or 0)
    lagged = int(g.get("truth_lagged_rows") or 0)
    lag = (f"; {_plural(lagged, 'row')} took count and tail from the replicas' majority "
           "because the host's truth lagged (async scheduling)") if lagged else ""
    lag += _untaken_text(g)
    if fixed == 0 and fields == 0:
        return (f"the guard changed nothing: {_plural(steps, 'guarded step')}, no token "
                f"replaced, no field of its own state repaired{lag}")
    recs = list(g.get("repairs") or [])
    dropped = int(g.get("repairs_dropped") or 0)
    by_field: dict[str, int] = {}
    for r in recs:
        f = str(r.get("field") or "field not recorded")
        f = "tail" if f.startswith("tail[") else f
        by_field[f] = by_field.get(f, 0) + 1
    reqs = list(g.get("repaired_requests") or [])
    detail = []
    if by_field:
        detail.append(", ".join(f"{k} ×{n}" for k, n in sorted(by_field.items())))
    if reqs:
        detail.append(("in request " if len(reqs) == 1 else "in requests ")
                      + ", ".join(str(x) for x in reqs))
    if recs:
        r = recs[0]
        detail.append(f"first at guard step {value_text(r.get('guard_step'))}, slot "
                      f"{value_text(r.get('slot'))}: {value_text(r.get('field'))} found "
                      f"{value_text(r.get('found'))}, truth {value_text(r.get('truth'))} from "
                      f"{value_text(r.get('truth_from'))}")
    if dropped:
        detail.append(f"{dropped} more repair record{'' if dropped == 1 else 's'} counted but "
                      "not kept")
    own = f" ({'; '.join(detail)})" if detail else ""
    return (f"the guard fixed {_plural(fixed, 'token')}, repaired "
            f"{_plural(fields, 'field')} of its own state{own} over "
            f"{_plural(steps, 'guarded step')}{lag}")


def _untaken_text(g: dict) -> str:
    """Rows that kept an end vLLM forced where none was due, the guard not reproducing their
    draw (``untaken_rows``, the first record's reason), else ""."""
    n = int(g.get("untaken_rows") or 0)
    recs = list(g.get("untaken") or [])
    why = f" (first: request {value_text(recs[0].get('req_id'))}, " \
          f"{value_text(recs[0].get('reason'))})" if recs else ""
    errs = int(g.get("redraw_errors") or 0)
    err = f"; the rejection sampler's redraw failed in {_plural(errs, 'step')}" if errs else ""
    if not n:
        return err
    return f"; {_plural(n, 'row')} kept an end forced where none was due{why}{err}"


_REPR = re.compile(r"\{[^{}]*\}|(?<![\w\]])\[[^\[\]]*\]")  # not an index: tail[0]


def _words(v: Any) -> str:
    """A literal in words; a dict's list values (marker ids) joined by spaces."""
    if isinstance(v, dict):
        return ", ".join(
            f"{str(k).replace('_', ' ')} "
            + ((" ".join(_words(t) for t in x) or "none") if isinstance(x, (list, tuple))
               else _words(x)) for k, x in v.items()) or "none"
    if isinstance(v, (list, tuple)):
        return ", ".join(_words(x) for x in v) or "none"
    return value_text(v)


def _literal(m: re.Match) -> str:
    try:
        v = ast.literal_eval(m.group(0))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return m.group(0)
    return _words(v) if isinstance(v, (dict, list)) else m.group(0)


def said(text: Any) -> Any:
    """A recorded sentence with Python reprs said in words: a dict of marker ids
    ``{'start': [368], 'end': [369]}`` -> "start 368, end 369", a list ``[0, 0, 0]`` -> "0,
    0, 0" (``[]`` -> "none"), ``None`` -> "not recorded". Anything not a string is returned
    as it is."""
    if not isinstance(text, str):
        return text
    for _ in range(3):  # nested reprs, innermost first
        new = _REPR.sub(_literal, text)
        if new == text:
            break
        text = new
    return re.sub(r"\bNone\b", NOT_RECORDED, text)


SENTENCE_KEYS = frozenset(("summary", "reason", "saw", "seen", "anomaly"))


def said_verdict(v: Any) -> Any:
    """``v`` with ``said`` applied to every sentence it holds (``SENTENCE_KEYS``, at any
    depth); the data (ids, counts, tables) unchanged."""
    if isinstance(v, dict):
        return {k: said(x) if k in SENTENCE_KEYS and isinstance(x, str) else said_verdict(x)
                for k, x in v.items()}
    if isinstance(v, list):
        return [said_verdict(x) for x in v]
    return v
