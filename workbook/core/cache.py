"""The workbook's cache folder (``$WORKBOOK_CACHE``, else ``~/.cache/workbook``): the offline
model folders are built under it (``workbook.core.models``, ``workbook.core.reporter_models``).
Only the folder's name: nothing here creates or reads it."""

from __future__ import annotations

import os


def cache_root() -> str:
    return os.environ.get("WORKBOOK_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                         "workbook"))
