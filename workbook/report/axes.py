"""The constraints grid's axes as a picture: constraint x method x axis value, per vLLM version.

``axes_html(grid)`` renders one ``grid.json`` that ran axis points (``workbook.run.constraints.axes``):
per axis, a table whose rows are the constraints and whose columns are method x value (the
other axes at their defaults — a ``vary: one`` grid — or every combination's first match).
Each cell is one symbol: ✓ held, ✗ violated (a link to its reproducer and upstream status
when ``grid["findings"]`` holds one for it, else the first step and row), R refused by vLLM
(its message as the tooltip), M method refused at engine start, ? not judged, n/a not
available on this workbook (an axis whose RunConfig fields are missing), ◌ ran but did not
reach the axis value (e.g. vLLM preempted nothing: ``Cell.unreached``). ``counts(grid)``:
cells run / held / violated / refused / not judged / not available / unreached.
"""

from __future__ import annotations

import html
from collections import Counter

SYMBOL = {"holds": "✓", "violated": "✗", "refused": "R", "method refused": "M",
          "not judged": "?", "not available": "n/a", "error": "!", "not run": "·"}
CSS = (".axes td,.axes th{border:1px solid #ccc;padding:1px 4px;text-align:center;"
       "font-size:12px}.axes .v{background:#fdd}.axes .u{background:#ffe}"
       ".axes .h{background:#efe}")


def counts(grid: dict) -> dict[str, int]:
    cells = grid.get("cells") or []
    st = Counter(c["status"] for c in cells)
    ran = sum(n for s, n in st.items() if s in ("holds", "violated", "not judged"))
    return {"cells": len(cells), "run": ran, "held": st.get("holds", 0),
            "violated": st.get("violated", 0), "refused": st.get("refused", 0),
            "method refused": st.get("method refused", 0),
            "not judged": st.get("not judged", 0), "not available": st.get("not available", 0),
            "errors": st.get("error", 0),
            "unreached": sum(1 for c in cells if c.get("unreached"))}


def _finding(grid: dict, c: dict) -> dict | None:
    for f in grid.get("findings") or []:
        if f.get("constraint") == c["constraint"] and f.get("method") == c["method"] and \
                all(c.get("axes", {}).get(k) == v for k, v in (f.get("axes") or {}).items()):
            return f
    return None


def _cell(grid: dict, c: dict | None) -> str:
    if c is None:
        return "<td></td>"
    e = html.escape
    sym = SYMBOL.get(c["status"], "?")
    cls = "v" if c["status"] == "violated" else "h" if c["status"] == "holds" else ""
    tip = c.get("message") or ""
    if c.get("unreached"):
        sym, cls, tip = sym + "◌", "u", "; ".join(c["unreached"])
    if c["status"] == "violated":
        first = c.get("first") or {}
        tip = (f"step {first.get('step')} row {first.get('row')} ({first.get('stage')}): "
               f"{first.get('what')}")
        f = _finding(grid, c)
        if f:
            sym = (f'<a href="{e(f.get("reproducer", ""))}" title="{e(tip)}">✗</a>'
                   f'<br><small>{e(f.get("upstream", ""))}</small>')
            return f'<td class="{cls}">{sym}</td>'
    return f'<td class="{cls}" title="{e(tip)}">{e(sym)}</td>'


def axes_html(grid: dict) -> str:
    axes = grid.get("axes") or {}
    if not axes:
        return ""
    defaults = grid.get("axis_defaults") or {}
    cells = grid.get("cells") or []
    methods = grid.get("methods") or sorted({c["method"] for c in cells})
    constraints = grid.get("constraints") or sorted({c["constraint"] for c in cells})
    e = html.escape
    k = counts(grid)
    out = [f"<style>{CSS}</style>",
           f'<p class="note">{k["cells"]} cells: {k["run"]} run, {k["held"]} held, '
           f'{k["violated"]} violated, {k["refused"]} refused, {k["method refused"]} method '
           f'refused, {k["not judged"]} not judged, {k["not available"]} not available, '
           f'{k["unreached"]} did not reach their axis value. ✓ held, ✗ violated, R refused, '
           "M method refused, ? not judged, n/a not available, ◌ the axis value was not "
           "reached.</p>"]
    for name, values in axes.items():
        others = {n: defaults.get(n) for n in axes if n != name}

        def at(c, v):
            ax = c.get("axes") or {}
            return ax.get(name) == v and all(ax.get(n) == d for n, d in others.items()
                                             if n in ax)

        head = "".join(f'<th colspan="{len(values)}">{e(m)}</th>' for m in methods)
        sub = "".join(f"<th>{e(str(v))}</th>" for _ in methods for v in values)
        rows = []
        for cons in constraints:
            tds = []
            for m in methods:
                for v in values:
                    c = next((c for c in cells if c["constraint"] == cons and c["method"] == m
                              and at(c, v)), None)
                    tds.append(_cell(grid, c))
            rows.append(f"<tr><th>{e(cons)}</th>{''.join(tds)}</tr>")
        out.append(f"<h4>axis {e(name)}</h4><table class=\"axes\"><tr><th rowspan=2>"
                   f"constraint</th>{head}</tr><tr>{sub}</tr>{''.join(rows)}</table>")
    return "".join(out)
