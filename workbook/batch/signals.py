"""Ctrl-C and SIGTERM during a batch: stop the current run, keep an honest record, exit.

``Guard(run_dir)`` (a context manager around ``workbook.batch.execute``) installs handlers for
SIGINT, SIGTERM and SIGHUP in the main thread:

- the **first** signal while runs execute raises ``Interrupted`` where the batch waits (the
  executor then kills the run's process tree — papermill, its kernel, vLLM's engine — and
  attaches the run's failure row, status ``interrupted``, to the exception); the batch stops
  starting runs, closes the manifest (status ``interrupted``), writes the report and
  ``SHA256SUMS`` and the command exits 128 + the signal (130 for Ctrl-C, 143 for SIGTERM);
- while the batch closes its folder, a first signal only cuts the optional parts short
  (environment probes, the report: ``optional()`` sections); the manifest and the checksums are
  always written;
- a **second** signal forces: the current run's processes are killed without waiting, a line
  names the (unfinished) folder, and the process exits at once. ``latest_runs`` and the report
  then treat the folder as unfinished (no ``SHA256SUMS``).

Outside the main thread (a library caller) nothing is installed. Not here: killing a process
tree (``proctree.kill_tree``), the manifest (``execute``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from workbook.batch.proctree import kill_tree

HANDLED = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                if s is not None)


class Interrupted(BaseException):
    """A signal stopped the batch; ``row`` is the interrupted run's manifest row, if any."""

    def __init__(self, signum: int, run: str | None = None):
        super().__init__(signum)
        self.signum = signum
        self.run = run
        self.row: dict | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Guard:
    def __init__(self, run_dir: str, out=sys.stderr):
        self.run_dir = run_dir
        self.out = out
        self.received: list[int] = []
        self.current: str | None = None  # the run executing now
        self.child: tuple[int, str | None] | None = None  # (pid, marker) of its process tree
        self.closing = False
        self._optional = False
        self._previous: dict[int, object] = {}

    # -- installation
    def __enter__(self) -> "Guard":
        # Imported now, not in a handler: a second signal landing while a first import of
        # psutil runs would find it half-initialised and leave the run's processes alive.
        import psutil  # noqa: F401

        if threading.current_thread() is threading.main_thread():
            for s in HANDLED:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous = {}
        return False

    # -- state
    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    @contextlib.contextmanager
    def optional(self):
        """A part of closing the batch that a signal may cut short (swallowed here)."""
        self._optional = True
        try:
            yield
        except Interrupted:
            pass
        finally:
            self._optional = False

    # -- the handler
    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            self._force(signum)
        name = signal.Signals(signum).name
        if not self.closing:
            print(f"\nworkbook: {name} received — stopping run {self.current or '(none)'} and "
                  "its processes, then closing the run folder (again to force)", file=self.out,
                  flush=True)
            raise Interrupted(signum, self.current)
        print(f"\nworkbook: {name} received while closing the run folder — finishing the "
              "manifest and SHA256SUMS (again to force)", file=self.out, flush=True)
        if self._optional:
            raise Interrupted(signum, self.current)

    def _force(self, signum) -> None:
        if self.child is not None:
            try:
                kill_tree(self.child[0], marker=self.child[1], wait=False)
            except BaseException:
                pass
        print(f"workbook: forced exit; the run folder is left unfinished: {self.run_dir}",
              file=self.out, flush=True)
        os._exit(128 + (self.first or signum))
