"""Sharing the findings: the self-contained HTML report (``html``) and the notebooks' views.

``write(run_dirs, path)`` / ``default_path(out)`` / ``NoRuns`` are ``workbook.report.html``'s;
``views`` holds the tables, plots and the step explorer the notebooks show (the steps × rows
grid is ``grid``, token text ``tokens``).
"""

from workbook.report.html import NoRuns, default_path, write  # noqa: F401
