"""The constraints section of the report: the constraint × method grid as HTML (and as text).

``section_html(grids)`` renders one or more ``grid.json`` dicts (``workbook.run.constraints``;
one per vLLM version) as a self-contained HTML fragment: per version a table, constraints down,
method × batch across; each cell says ``holds`` (rows checked, draft rows, accepted drafts;
for a structured output how many tokens its grammar accepted from where), ``not judged`` (why:
the cell's own contract could not be checked on the output — never counted as held),
``violated`` (step, row, local position, contract, stage, what), ``refused by vLLM`` (vLLM's
message), ``method refused`` (vLLM rejected the speculative method itself at engine start: its
message) or ``error`` (the message); the differential against method ``none`` under it (identical,
or the first divergent output index with its step, row and top-1/top-2 margin; for a request
with prompt logprobs, whether they equal ``none``'s or the first position that differs). A sentence over
the grid counts what held, what was violated and what vLLM refused, from the cells themselves.
``text_grid(grid)``: the same grid as plain text (the CLI's output).

``load(paths)`` reads the ``grid.json`` files a report shows (``workbook report`` passes the
folders it was given, else ``outputs/*/``'s ``constraints-*``); ``section_html([])`` is "" (no
section without a grid).
Not here: running anything, judging anything.
"""

from __future__ import annotations

import html
from collections import Counter

from workbook.report import wording

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
    fault = f" with fault {grid['fault']}" if grid.get("fault") else ""
    return (f"vLLM {grid.get('vllm_version') or 'version not recorded'}{fault}: {len(cells)} cells "
            f"({len(grid.get('constraints', []))} constraints × methods {methods} × batches "
            f"{', '.join(grid.get('batches', []))}): " + ", ".join(parts) + ".")


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
        f = c.get("first") or {}
        v = wording.value_text
        detail = (f"step {v(f.get('step'))}, row {v(f.get('row'))} (j={v(f.get('local_pos'))}): "
                  f"{v(f.get('contract'))} at {v(f.get('stage'), 'stage not named')} — "
                  f"{v(f.get('what'))}")
    elif st == "not judged":
        detail = c.get("message") or "no reason recorded"
    else:
        detail = c.get("message") or ("no message recorded" if st != "not run" else "")
    d = c.get("differential")
    if d:
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


def finding_lines(grids: list[dict]) -> list[str]:
    """What the grids found, for the report's lead, one sentence per grid (counted from its
    cells): every judged cell held, or which constraint was violated with which methods, and
    the first violated cell's step, row, stage and what broke."""
    out = []
    for g in grids:
        cells = g.get("cells", [])
        v = wording.value_text(g.get("vllm_version"))
        bad = [c for c in cells if c["status"] == "violated"]
        held = sum(c["status"] == "holds" for c in cells)
        rest = Counter(c["status"] for c in cells if c["status"] not in ("holds", "violated"))
        rest_text = "".join(f", {n} {st}" for st, n in sorted(rest.items()))
        if not bad:
            out.append(f"Constraints on vLLM {v}: no violation; {held} of {len(cells)} cells "
                       f"held at every row and on the output{rest_text}.")
            continue
        by: dict[str, list[str]] = {}
        for c in bad:
            by.setdefault(c["constraint"], [])
            if c["method"] not in by[c["constraint"]]:
                by[c["constraint"]].append(c["method"])
        f = bad[0].get("first") or {}
        where = (f"step {f.get('step')}, row {f.get('row')}" if f.get("step") is not None
                 else "no step recorded")
        what = "; ".join(f"{k} with {', '.join(ms)}" for k, ms in by.items())
        out.append(f"Constraints on vLLM {v}: {len(bad)} of {len(cells)} cells violated — "
                   f"{what} ({held} held{rest_text}). First: {bad[0]['constraint']} / {bad[0]['method']} / "
                   f"{bad[0]['batch']} at {where}, {f.get('stage') or 'stage not named'}: "
                   f"{f.get('what') or 'no detail recorded'}.")
    return out


def finding_html(grids: list[dict]) -> str:
    """The grids' lead (``finding_lines``) as a finding box; "" without a grid."""
    lines = finding_lines(grids)
    if not lines:
        return ""
    alarm = any(c["status"] == "violated" for g in grids for c in g.get("cells", []))
    items = "".join(f"<li>{html.escape(x)}</li>" for x in lines)
    return (f'<section class="finding{" alarm" if alarm else ""}"><p class="headline">'
            f'{"A per-request constraint was violated under speculative decoding" if alarm else "Every judged constraint held under speculative decoding"}'
            f' (<a href="#constraints">grid</a>)</p><ul>{items}</ul></section>')


def section_html(grids: list[dict]) -> str:
    """The report section over one grid per vLLM version."""
    if not grids:
        return ""
    from workbook.report import axes as raxes

    body = "".join(f"<h3>vLLM {html.escape(wording.value_text(g.get('vllm_version')))}</h3>"
                   f"{_notes_html(g)}{raxes.axes_html(g) or table_html(g)}" for g in grids)
    return (f'<section id="constraints"><style>{CSS}</style><h2>{TITLE}</h2>'
            '<p class="note">Each cell: ✓ the contract held at every logits row (draft rows '
            'included) and on the output; ✗ the first violating step and row; "not judged": '
            "nothing broke but the cell's own contract could not be checked on what the run "
            "produced (never counted as held); refused: vLLM's own message; method refused: "
            "vLLM rejected the speculative method at engine start (its message).</p>"
            f"{body}</section>")


def _notes_html(grid: dict) -> str:
    """Corrections made to a committed grid after its run (``corrections`` in grid.json)."""
    notes = grid.get("corrections") or []
    return "".join(f'<p class="note">Correction ({html.escape(str(n.get("date", "")))}): '
                   f"{html.escape(str(n.get('what', '')))}</p>" for n in notes)


def load(paths: list[str]) -> list[dict]:
    """The ``grid.json`` files under ``paths`` (a grid.json itself, a folder holding one, or a
    folder whose ``constraints-*`` subfolders hold one), oldest vLLM version first."""
    import glob
    import json
    import os

    files: list[str] = []
    for p in paths:
        if os.path.isfile(p) and p.endswith(".json"):
            files.append(p)
        elif os.path.isfile(os.path.join(p, GRID)):
            files.append(os.path.join(p, GRID))
        else:
            files += sorted(glob.glob(os.path.join(p, "constraints-*", GRID)))
    seen, grids = set(), []
    for f in files:
        f = os.path.abspath(f)
        if f in seen:
            continue
        seen.add(f)
        with open(f, encoding="utf-8") as fh:
            g = json.load(fh)
        if isinstance(g, dict) and "cells" in g:
            grids.append(g)
    return sorted(grids, key=lambda g: _version_key(g.get("vllm_version")))


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
