"""Sharing the findings: the self-contained HTML report (``html``) and the notebooks' views.

``write(run_dirs, path)`` / ``default_path(out)`` are ``workbook.report.html``'s; ``views``
holds the tables, plots and the step explorer the notebooks show.
"""

from workbook.report.html import default_path, write  # noqa: F401
