"""The constraints section of the report: the constraint × method grid as HTML (and as text).

``section_html(grids)`` renders one or more ``grid.json`` dicts (``workbook.run.constraints``;
one per vLLM version) as a self-contained HTML fragment: per version a table, constraints down,
method × batch across; each cell says ``holds`` (rows checked, draft rows, accepted drafts),
``violated`` (step, row, local position, contract, stage, what), ``refused by vLLM`` (vLLM's
message) or ``error`` (the message); the differential against method ``none`` under it (identical,
or the first divergent output index with its step, row and top-1/top-2 margin). A sentence over
the grid counts what held, what was violated and what vLLM refused, from the cells themselves.
``text_grid(grid)``: the same grid as plain text (the CLI's output).

The lead wires ``section_html`` into ``workbook/report/html.py``; nothing here reads files.
Not here: running anything, judging anything.
"""

from __future__ import annotations

import html
from collections import Counter

SYMBOL = {"holds": "✓", "violated": "✗", "refused": "refused", "error": "error",
          "not run": "–"}
CSS = """
.cgrid{border-collapse:collapse;font:12px/1.35 system-ui,sans-serif;margin:6px 0 16px}
.cgrid th,.cgrid td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
.cgrid td.holds{background:#e8f5e9}.cgrid td.violated{background:#ffebee}
.cgrid td.refused{background:#fff8e1}.cgrid td.error{background:#eceff1}
.cgrid small{color:#555;display:block;max-width:26em}
"""


def summary(grid: dict) -> str:
    """One sentence over a grid, counted from its cells."""
    cells = grid.get("cells", [])
    n = Counter(c["status"] for c in cells)
    methods = ", ".join(grid.get("methods", []))
    parts = [f"{n.get('holds', 0)} held", f"{n.get('violated', 0)} violated",
             f"{n.get('refused', 0)} refused by vLLM"]
    if n.get("error"):
        parts.append(f"{n['error']} failed")
    fault = f" with fault {grid['fault']}" if grid.get("fault") else ""
    return (f"vLLM {grid.get('vllm_version', '?')}{fault}: {len(cells)} cells "
            f"({len(grid.get('constraints', []))} constraints × methods {methods} × batches "
            f"{', '.join(grid.get('batches', []))}): " + ", ".join(parts) + ".")


def _cell_text(c: dict) -> tuple[str, str]:
    st = c["status"]
    if st == "holds":
        detail = f"{c['rows']} rows ({c['draft_rows']} draft, {c['accepted_drafts']} accepted)"
    elif st == "violated":
        f = c["first"] or {}
        detail = (f"step {f.get('step')}, row {f.get('row')} (j={f.get('local_pos')}): "
                  f"{f.get('contract')} at {f.get('stage')} — {f.get('what')}")
    else:
        detail = c.get("message") or ""
    d = c.get("differential")
    if d:
        detail += "; vs none: identical" if d.get("identical") else (
            f"; vs none: differs at output {d.get('out_index')} (step {d.get('step')}, row "
            f"{d.get('row')}, margin {d.get('margin', float('nan')):.3g})")
    return SYMBOL.get(st, st), detail


def table_html(grid: dict) -> str:
    cells = grid.get("cells", [])
    cols = [(m, b) for m in grid.get("methods", []) for b in grid.get("batches", [])]
    by = {(c["constraint"], c["method"], c["batch"]): c for c in cells}
    e = html.escape
    head = "".join(f"<th>{e(m)}<br><small>{e(b)}</small></th>" for m, b in cols)
    rows = []
    for k in grid.get("constraints", []):
        tds = []
        for m, b in cols:
            c = by.get((k, m, b))
            if c is None:
                tds.append("<td>–</td>")
                continue
            sym, detail = _cell_text(c)
            tds.append(f'<td class="{e(c["status"])}">{e(sym)}<small>{e(detail)}</small></td>')
        rows.append(f"<tr><th>{e(k)}</th>{''.join(tds)}</tr>")
    return (f'<p>{e(summary(grid))}</p><table class="cgrid"><tr><th>constraint</th>{head}</tr>'
            + "".join(rows) + "</table>")


def section_html(grids: list[dict]) -> str:
    """The report section over one grid per vLLM version."""
    if not grids:
        return "<section><h2>Sampling constraints</h2><p>No constraints grid was run.</p></section>"
    body = "".join(f"<h3>vLLM {html.escape(str(g.get('vllm_version')))}</h3>{table_html(g)}"
                   for g in grids)
    return f"<section><style>{CSS}</style><h2>Sampling constraints × speculative method</h2>" \
           f"{body}</section>"


def text_grid(grid: dict) -> str:
    lines = [summary(grid)]
    for c in grid.get("cells", []):
        sym, detail = _cell_text(c)
        lines.append(f"  {c['constraint']:<22} {c['method']:<12} {c['batch']:<14} {sym:<8} "
                     f"{detail}")
    return "\n".join(lines)
