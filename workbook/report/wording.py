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

Not here: judging anything (``workbook.run.diagnose``), HTML (``workbook.report.page``).
"""

from __future__ import annotations

import json
import math
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
        said = v.get("summary")
        return (f"honored — {said}" if not absent(said) else
                "honored — every request ended its reasoning where the budget puts it") + \
            (f" ({n} request{'s' if n != 1 else ''} judged)" if n else "")
    if verdict == "violated":
        return "violated — no cause named (unclassified: see the anomalies)"
    return f"{verdict} — {value_text(v.get('summary'), 'no summary recorded')}"
