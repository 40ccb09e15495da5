"""The report's page: HTML assembly, table cells, itables offline, the style sheet.

Tables are plain HTML, or interactive through itables in offline mode (its DataTables bundle
embedded once as a ``data:`` module) with paging off; an empty value shows as "—" and an
empty table as the sentence its caller gives; everything wraps to fit a 1400 px window.
Not here: what the page says (``workbook.report.html``, ``workbook.report.finding``).
"""

from __future__ import annotations

import html
import json
import math

import pandas as pd

from workbook.report import grid
from workbook.report.wording import DASH

def _empty(v) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip() in ("", "nan", "None", "NaN")


def _cell(v):
    if _empty(v):
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(v, default=str)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _esc_cell(v) -> str:
    v = _cell(v)
    return v if isinstance(v, str) and v.startswith("<a ") else html.escape(str(v))


class Page:
    """An HTML page assembled from sections; itables' offline bundle goes in once."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.n_tables = 0

    def h(self, level: int, text: str, anchor: str | None = None) -> None:
        a = f' id="{anchor}"' if anchor else ""
        self.parts.append(f"<h{level}{a}>{html.escape(text)}</h{level}>")

    def p(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{html.escape(text)}</p>')

    def raw(self, text: str) -> None:
        self.parts.append(text)

    def table(self, df: pd.DataFrame, caption: str | None = None,
              empty: str = "Nothing to show here.") -> None:
        """Interactive (sort, search), never paged, wrapping to the page width."""
        from itables import to_html_datatable

        self.n_tables += 1
        if df.empty:
            self.p(empty, "empty")
            return
        df = df.map(_esc_cell) if hasattr(df, "map") else df.applymap(_esc_cell)
        self.parts.append('<div class="tw">' + to_html_datatable(
            df, caption=caption, connected=False, table_id=f"wbtable{self.n_tables}",
            showIndex=False, maxBytes=0, classes="display compact wrap", paging=False,
            autoWidth=False, allow_html=True, style="width:100%;table-layout:auto",
            layout={"topStart": None, "topEnd": "search", "bottomStart": "info",
                    "bottomEnd": None}) + "</div>")

    def plain(self, df: pd.DataFrame, caption: str | None = None, cls: str = "",
              empty: str = "Nothing to show here.") -> None:
        """A plain HTML table (small tables)."""
        if df.empty:
            self.p(empty, "empty")
            return
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
        body = []
        for rec in df.itertuples(index=False):
            tds = []
            for v in rec:
                c = _cell(v)
                klass = f' class="v-{c}"' if c in ("honored", "violated", "inconclusive",
                                                    "failed", "timeout", "interrupted") else ""
                tds.append(f"<td{klass}>{_esc_cell(v)}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self.parts.append(f'<div class="tw"><table class="plain {cls}">{cap}<thead><tr>{head}'
                          f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>")

    def image(self, uri: str | None, alt: str) -> None:
        if uri:
            self.parts.append(f'<img alt="{html.escape(alt)}" src="{uri}">')
        else:
            self.p(f"No finished run to draw ({alt}).", "empty")

    def pre(self, text: str, summary: str) -> None:
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary>"
                          f"<pre>{html.escape(text)}</pre></details>")

    def render(self) -> str:
        from itables import options
        from itables.javascript import generate_init_offline_itables_html

        init = offline_init(generate_init_offline_itables_html(options.dt_bundle))
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                "<meta name=\"viewport\" content=\"width=device-width\">"
                f"<title>{html.escape(self.title)}</title><style>{CSS}{grid.CSS}</style>"
                f"</head><body>{init}\n" + "\n".join(self.parts) + "</body></html>\n")


_BLOB_IMPORT = """    const blob = new Blob([jsText], { type: 'application/javascript' });
    const url = URL.createObjectURL(blob);
    const module = await import(url);
    URL.revokeObjectURL(url);
    return module;"""
_DATA_IMPORT = """    return await import('data:text/javascript;base64,' + base64JS);"""


def offline_init(init_html: str) -> str:
    """itables' offline loader, importing its bundle from a ``data:`` URI instead of a blob.

    Nothing but ``file:`` and ``data:`` URLs is then requested by the page (checked by
    ``tests/test_report_offline.py``). Fails loudly if itables changed its loader.
    """
    if init_html.count(_BLOB_IMPORT) != 1:
        raise RuntimeError("itables' offline loader changed; update workbook.report.html")
    return init_html.replace(_BLOB_IMPORT, _DATA_IMPORT)


CSS = """body{font-family:system-ui,sans-serif;margin:1.2em auto;max-width:1360px;padding:0 20px;
color:#1b1b1b}
h1{font-size:1.45em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
h3{font-size:1.02em;margin:.9em 0 .3em}img{max-width:100%}
pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:.8em;white-space:pre-wrap;word-break:break-word}
.empty{color:#777}.note{color:#555;font-size:.92em}.bad{color:#b00020}.ok{color:#1a7f37}
section.finding{border:2px solid #2ca02c;background:#f3faf3;border-radius:6px;padding:.4em 1em .6em;margin:.6em 0 1em}
section.finding.alarm{border-color:#d62728;background:#fdf3f3}
section.finding.warn{border-color:#d9a400;background:#fffbea}
section.finding.mixed{border-color:#d9a400;background:#fffdf3}
p.q{margin:.3em 0 0;color:#555;font-size:.95em}ul.answer{margin:.2em 0 .6em;font-weight:600}
p.headline{font-size:1.18em;font-weight:600;margin:.4em 0}
.fb h3{margin:.6em 0 .1em}.fb ul{margin:.2em 0}.fb ol.viol{margin:.2em 0 .4em;padding-left:1.6em}
.fb ol.viol li{margin:.25em 0}.stage{font-weight:600}.cause{color:#7a1f1f}.chain{font-size:.9em;color:#444}
.tag{font-size:.8em;padding:1px 6px;border-radius:8px;background:#eee;margin-left:.5em}
.tag.bad{background:#fde2e1}
.tw{max-width:100%;overflow-x:auto}
table.plain{border-collapse:collapse;font-size:.88em;margin:.4em 0}
table.plain th,table.plain td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top;
overflow-wrap:anywhere}table.plain th{overflow-wrap:normal}
table.plain th{background:#f3f3f3}table.plain caption{caption-side:bottom;color:#555;font-size:.9em}
td.v-honored{background:#e6f4e6}td.v-violated{background:#fbd5d5;font-weight:600}
td.v-failed,td.v-timeout,td.v-interrupted{background:#fff0c2}
table.dataTable{font-size:.85em}
table.dataTable td{white-space:normal!important;overflow-wrap:break-word}
table.dataTable th{white-space:normal!important;overflow-wrap:normal;word-break:normal}
table.dataTable caption{caption-side:bottom;color:#555}
nav.toc{font-size:.9em;color:#444}nav.toc a{margin-right:.9em}
.viol-block{border-left:4px solid #d62728;padding-left:.8em;margin:1em 0 1.6em}"""


def link_html(href: str | None, text: str) -> str | None:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>' if href else None


