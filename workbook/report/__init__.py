"""Sharing the findings: the self-contained HTML report (``html``) and the notebooks' views.

``write(run_dirs, path)`` / ``default_path(out)`` / ``NoRuns`` are ``workbook.report.html``'s
(imported on first use, so that ``workbook.report.nbclean`` — JupyterLab's save hook — loads
without pandas); the runs and their finding are ``runs`` and ``finding``, absent values are
worded by ``wording``; ``views`` holds the tables, plots and the step explorer the notebooks
show (the steps × rows grid is ``grid``, token text ``tokens``); ``constraints`` renders the
constraint × method grids (``grid.json``) as the report's "Constraints under speculative
decoding" section.
"""

_FROM_HTML = ("NoRuns", "default_path", "write")


def __getattr__(name):
    if name in _FROM_HTML:
        from workbook.report import html

        return getattr(html, name)
    raise AttributeError(f"module 'workbook.report' has no attribute {name!r}")
