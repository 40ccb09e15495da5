"""A run's process tree: its processes (the root's descendants and every process tagged with
the run's marker in its environment, also those re-parented away) and killing them by id, never
by name. Used by the executors (a run that ends or times out) and the signal handler (a run
interrupted); re-exported by ``workbook.batch.executors``. Deliberately not here: starting
processes or deciding when to stop them.
"""

from __future__ import annotations

import os
from typing import Any

MARKER = "WORKBOOK_RUN_TAG"  # in the environment of every process of a papermill run


def run_processes(pid: int | None = None, marker: str | None = None) -> list:
    """The live processes of a run: ``pid`` and its descendants, and every process whose
    environment carries ``WORKBOOK_RUN_TAG=marker`` (also those re-parented away from it)."""
    import psutil

    found: dict[int, Any] = {}
    if pid is not None:
        try:
            root = psutil.Process(pid)
            for p in [root] + root.children(recursive=True):
                found[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    if marker:
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            try:
                if p.environ().get(MARKER) == marker:
                    found[p.pid] = p
            except (psutil.Error, OSError):
                pass
    return list(found.values())


def kill_tree(pid: int, marker: str | None = None, wait: bool = True) -> None:
    """Kill ``pid``, every descendant (the kernel, vLLM's engine processes) and every process
    tagged with ``marker`` — by id, never by name."""
    import psutil

    procs = run_processes(pid, marker)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if wait:
        psutil.wait_procs(procs, timeout=30)
