"""The constraints section of the report: the constraint × method grid as HTML (and as text).

``section_html(grids)`` renders one or more ``grid.json`` dicts (``workbook.run.constraints.cases``;
one per vLLM version) as a self-contained HTML fragment: per version a table, constraints down,
method × batch across; each cell says ``holds`` (rows checked, draft rows, accepted drafts;
for a structured output how many tokens its grammar accepted from where), ``not judged`` (why:
the cell's own contract could not be checked on the output — never counted as held),
``violated`` (step, row, local position, contract, stage, what: read from the cell's verdict
record, ``workbook.run.verdicts.Verdict``, the one shape the budget's diagnosis gives too),
``refused by vLLM`` (vLLM's
message), ``method refused`` (vLLM rejected the speculative method itself at engine start: its
message) or ``error`` (the message); the differential against method ``none`` under it (identical,
or the first divergent output index with its step, row and top-1/top-2 margin; for a request
with prompt logprobs, whether they equal ``none``'s or the first position that differs). A sentence over
the grid counts what held, what was violated and what vLLM refused, from the cells themselves;
a cell another request's constraint reached (``affected_by``: attributed to that request, its
own contracts held) says so, and a table under the grid lists each such touch.
``text_grid(grid)``: the same grid as plain text (the CLI's output).

``load(paths)`` reads the ``grid.json`` files a report shows (``workbook report`` passes the
folders it was given, else ``outputs/*/``'s ``constraints-*``); ``section_html([])`` is "" (no
section without a grid).
Not here: running anything, judging anything.
"""

from __future__ import annotations

import html
import os
from collections import Counter

from workbook.report import wording
from workbook.run import verdicts

GRID = "grid.json"
TITLE = "Constraints under speculative decoding"

SYMBOL = {"holds": "✓", "violated": "✗", "not judged": "not judged", "refused": "refused",
          "method refused": "method refused", "error": "error", "not run": "–"}
CSS = """
.cgrid{border-collapse:collapse;font:12px/1.35 system-ui,sans-serif;margin:6px 0 16px}
.cgrid th,.cgrid td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
.cgrid td.holds{background:#e8f5e9}.cgrid td.violated{background:#ffebee}
.cgrid td.refused,.cgrid td.method-refused{background:#fff8e1}
.cgrid td.error{background:#eceff1}
.cgrid td.not-judged{background:#f3e5f5}
.cgrid small{color:#555;display:block;max-width:26em}
"""


def summary(grid: dict) -> str:
    """One sentence over a grid, counted from its cells."""
    cells = grid.get("cells", [])
    n = Counter(c["status"] for c in cells)
    methods = ", ".join(grid.get("methods", []))
    parts = [f"{n.get('holds', 0)} held", f"{n.get('violated', 0)} violated"]
    if n.get("not judged"):
        why = sorted({c["constraint"] for c in cells if c["status"] == "not judged"})
        parts.append(f"{n['not judged']} not judged ({', '.join(why)}: the output contract "
                     "could not be checked on what the run produced)")
    parts.append(f"{n.get('refused', 0)} refused by vLLM")
    if n.get("method refused"):
        why = sorted({c["method"] for c in cells if c["status"] == "method refused"})
        parts.append(f"{n['method refused']} not run because vLLM refused the method itself "
                     f"at engine start ({', '.join(why)})")
    if n.get("error"):
        parts.append(f"{n['error']} failed")
    touched = sum(1 for c in cells if (verdict_of(c) or {}).get("affected_by"))
    if touched:
        parts.append(f"{touched} touched by a neighbour's constraint (their own contracts "
                     "held there)")
    victims = sum(1 for c in cells if c.get("victim"))
    if victims:
        parts.append(f"{victims} of the violated are victims (their own contracts held; their "
                     "rows or output changed by another request, the slot's history or a "
                     "cause no contract explains)")
    fault = f" with fault {grid['fault']}" if grid.get("fault") else ""
    return (f"vLLM {grid.get('vllm_version') or 'version not recorded'}{fault}: {len(cells)} cells "
            f"({len(grid.get('constraints', []))} constraints × methods {methods} × batches "
            f"{', '.join(grid.get('batches', []))}): " + ", ".join(parts) + ".")


def verdict_of(c: dict) -> dict | None:
    """The cell's verdict record (the one shape, ``workbook.run.verdicts.Verdict``): as the
    grid wrote it, or built from an older grid's cell."""
    return c.get("verdict") or verdicts.of_cell(c)


def affected_text(c: dict) -> str:
    """Who else's constraint reached this cell's rows (its own contracts held there), or ""."""
    v = verdict_of(c) or {}
    parts = [f"request {wording.value_text(a.get('request'))}'s "
             f"{wording.value_text(a.get('contract'))} reached its row at step "
             f"{wording.value_text(a.get('step'))}, row {wording.value_text(a.get('row'))}"
             for a in v.get("affected_by") or []]
    if not parts:
        return ""
    return ("touched by a neighbour (not a breach of its own contracts): " + "; ".join(parts[:3])
            + (f"; and {len(parts) - 3} more" if len(parts) > 3 else ""))


def affected_rows(grid: dict) -> list[dict]:
    """One row per cell another request's constraint reached: the cell, its own verdict, who
    touched it, where, and the evidence."""
    out = []
    for c in grid.get("cells", []):
        v = verdict_of(c) or {}
        for a in v.get("affected_by") or []:
            out.append({"constraint": c["constraint"], "method": c["method"],
                        "batch": c["batch"], "own verdict": v.get("verdict"),
                        "by request": a.get("request"), "by contract": a.get("contract"),
                        "step": a.get("step"), "row": a.get("row"), "column": a.get("column"),
                        "evidence": a.get("evidence")})
    return out


def _affected_html(grid: dict) -> str:
    rows = affected_rows(grid)
    if not rows:
        return ""
    e = html.escape
    v = wording.value_text
    keys = ("constraint", "method", "batch", "own verdict", "by request", "by contract", "step",
            "row", "column", "evidence")
    body = "".join("<tr>" + "".join(f"<td>{e(v(r[k]))}</td>" for k in keys) + "</tr>"
                   for r in rows)
    return (f"<p>{len(rows)} time(s) a request's rows carried another request's constraint "
            "(attributed to that request; the touched request's own contracts held there):</p>"
            f'<table class="cgrid"><tr>{"".join(f"<th>{e(k)}</th>" for k in keys)}</tr>'
            f"{body}</table>")


def _cell_text(c: dict) -> tuple[str, str]:
    st = c["status"]
    if st == "holds":
        detail = f"{c['rows']} rows ({c['draft_rows']} draft, {c['accepted_drafts']} accepted)"
        g = c.get("grammar")
        if g and g.get("start") is not None:
            detail += (f"; the grammar accepted {g.get('fed', 0)} token(s) from output index "
                       f"{g['start']}" + (", to its end" if g.get("terminated")
                                          else ", a valid prefix"))
    elif st == "violated":
        f = verdict_of(c) or {}
        v = wording.value_text
        detail = (f"step {v(f.get('step'))}, row {v(f.get('row'))} (j={v(f.get('local_pos'))}): "
                  f"{v(f.get('contract'))} at {v(f.get('stage'), 'stage not named')} — "
                  f"{v(f.get('evidence'))}")
    elif st == "not judged":
        detail = c.get("message") or "no reason recorded"
    else:
        detail = c.get("message") or ("no message recorded" if st != "not run" else "")
    touched = affected_text(c)
    if touched:
        detail += f"; {touched}"
    d = c.get("differential")
    if d and d.get("unavailable"):
        detail += f"; vs none: not compared ({d['unavailable']})"
    elif d:
        v = wording.value_text
        margin = d.get("margin")
        margin = "margin not recorded" if wording.absent(margin) else f"margin {margin:.3g}"
        detail += "; vs none: identical" if d.get("identical") else (
            f"; vs none: differs at output {v(d.get('out_index'))} (step {v(d.get('step'))}, "
            f"row {v(d.get('row'))}, {margin})")
        pl = d.get("prompt_logprobs")
        if pl:
            detail += "; prompt logprobs vs none: " + (
                "identical" if pl == "identical" else v(pl.get("what")))
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
            klass = c["status"].replace(" ", "-")
            tds.append(f'<td class="{e(klass)}">{e(sym)}<small>{e(detail)}</small></td>')
        rows.append(f"<tr><th>{e(k)}</th>{''.join(tds)}</tr>")
    return (f'<p>{e(summary(grid))}</p><table class="cgrid"><tr><th>constraint</th>{head}</tr>'
            + "".join(rows) + "</table>")


def section_html(grids: list[dict]) -> str:
    """The report section over one grid per vLLM version."""
    if not grids:
        return ""
    from workbook.report import axes as raxes

    body = "".join(f"<h3>vLLM {html.escape(wording.value_text(g.get('vllm_version')))}"
                   f"{html.escape(_origin(g))}</h3>{_notes_html(g)}"
                   f'<div class="tw">{raxes.axes_html(g) or table_html(g)}</div>'
                   f"{_affected_html(g)}" for g in grids)
    return (f'<section id="constraints"><style>{CSS}</style><h2>{TITLE}</h2>'
            '<p class="note">Each cell: ✓ the contract held at every logits row (draft rows '
            'included) and on the output; ✗ the first violating step and row; "not judged": '
            "nothing broke but the cell's own contract could not be checked on what the run "
            "produced (never counted as held); refused: vLLM's own message; method refused: "
            "vLLM rejected the speculative method at engine start (its message).</p>"
            f"{body}</section>")


def _origin(grid: dict) -> str:
    """" — committed evidence (outputs/cpu/constraints-axes-0.32.0)", or the run folder's name."""
    p = grid.get("path")
    if not p:
        return ""
    folder = os.path.dirname(p)
    if committed(grid):
        return (" — committed evidence ("
                + os.path.relpath(folder, os.path.dirname(REPO_OUTPUTS)) + ")")
    return f" — {os.path.basename(os.path.dirname(folder))}/{os.path.basename(folder)}"


def _notes_html(grid: dict) -> str:
    """Corrections made to a committed grid after its run (``corrections`` in grid.json)."""
    notes = grid.get("corrections") or []
    return "".join(f'<p class="note">Correction ({html.escape(str(n.get("date", "")))}): '
                   f"{html.escape(str(n.get('what', '')))}</p>" for n in notes)


def find(folder_pattern: str) -> list[str]:
    """The ``grid.json`` paths of the folders matching ``folder_pattern`` (a glob), each named
    ``grid.json`` whether it is kept plain or as ``grid.json.gz`` (lean committed evidence)."""
    import glob

    return sorted({f.removesuffix(".gz") for f in glob.glob(os.path.join(folder_pattern, GRID))
                   + glob.glob(os.path.join(folder_pattern, GRID + ".gz"))})


def load(paths: list[str]) -> list[dict]:
    """The ``grid.json`` files under ``paths`` (a grid.json itself, a folder holding one, or a
    folder whose ``constraints-*`` subfolders hold one), oldest vLLM version first; each
    grid keeps where it was read (``path``: ``committed`` tells committed evidence apart)."""
    from workbook.core import rundir

    files: list[str] = []
    for p in paths:
        q = p.removesuffix(".gz")
        if q.endswith(".json") and (os.path.isfile(q) or os.path.isfile(q + ".gz")):
            files.append(q)
        elif os.path.isfile(os.path.join(p, GRID)) or os.path.isfile(os.path.join(p, GRID + ".gz")):
            files.append(os.path.join(p, GRID))
        else:
            files += find(os.path.join(p, "constraints-*"))
    seen, grids = set(), []
    for f in files:
        f = os.path.abspath(f)
        if f in seen:
            continue
        seen.add(f)
        g = rundir.read_json(f)  # grid.json, or grid.json.gz as committed evidence keeps it
        if isinstance(g, dict) and "cells" in g:
            g["path"] = f
            grids.append(g)
    return sorted(grids, key=lambda g: _version_key(g.get("vllm_version")))


REPO_OUTPUTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "outputs")


def committed(grid: dict, root: str = REPO_OUTPUTS) -> bool:
    """A grid committed with the workbook: ``<root>/<hardware>/constraints-*/grid.json``
    (a grid of one's own is a run folder, ``<hardware>/<run-id>``)."""
    p = grid.get("path") or ""
    folder = os.path.dirname(p)
    return (os.path.basename(folder).startswith("constraints-")
            and os.path.dirname(os.path.dirname(folder)) == os.path.abspath(root))


def _version_key(v) -> tuple:
    parts = []
    for x in str(v or "").split("."):
        parts.append(int(x) if x.isdigit() else -1)
    return tuple(parts)


def text_grid(grid: dict) -> str:
    lines = [summary(grid)]
    for n in grid.get("corrections") or []:
        lines.append(f"  correction ({n.get('date', '')}): {n.get('what', '')}")
    for c in grid.get("cells", []):
        sym, detail = _cell_text(c)
        lines.append(f"  {c['constraint']:<22} {c['method']:<12} {c['batch']:<14} {sym:<8} "
                     f"{detail}")
    return "\n".join(lines)
