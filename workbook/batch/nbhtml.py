"""An executed notebook as one offline HTML page (nbconvert's lab template, code optional).

``render(ipynb, html_path, hide_code=False)``: images embedded, no require.js, MathJax,
Mermaid or widget renderer loaded from a CDN (those blocks of the template are emptied), so the page, like
the report linking it, requests nothing from the network. ``hide_code`` drops the input cells
and prompts (``workbook run --hide-code``). Not here: executing notebooks (``executors``).
"""

from __future__ import annotations

import os

WIDGET = "application/vnd.jupyter.widget-view+json"

_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


def exporter(hide_code: bool = False):
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exp = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"wb.j2": _TEMPLATE})],
                       template_file="wb.j2")
    exp.embed_images = True
    exp.exclude_input = hide_code
    exp.exclude_input_prompt = hide_code
    exp.exclude_output_prompt = hide_code
    return exp


def render(ipynb: str, html_path: str, hide_code: bool = False) -> str:
    """Write ``html_path`` from the executed notebook ``ipynb``; return the path."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata.pop("widgets", None)  # widget views need a live kernel: the static copies stay
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if WIDGET in out.get("data", {}):
                out["data"] = {"text/html": "<p><i>(an interactive widget: open the notebook "
                                            "in JupyterLab to use it; a static copy follows)"
                                            "</i></p>"}
    body, _ = exporter(hide_code).from_notebook_node(nb)
    os.makedirs(os.path.dirname(os.path.abspath(html_path)), exist_ok=True)
    with open(html_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(html_path + ".tmp", html_path)
    return html_path
