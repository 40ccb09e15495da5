"""THE progress display of every command that can run longer than ~10 s (one place).

``workbook run`` (runs), ``workbook run constraints`` (engines), ``check-server --constraints``
(cases), the distribution oracle (cells) and ``workbook watch`` (start-ups) all draw it:

- ``Progress(total, desc, enabled, unit=...)``: a tqdm bar on stderr over the command's units;
  its postfix is what runs now. ``step(text)`` names the current step and times it itself (on
  a terminal the postfix is redrawn every second with the step's seconds, so a long engine
  start shows why nothing else moves); ``stage(key, text)`` is the same with a caller's own
  text (the batch's, which reads the run's step from its folder); ``done(line)`` ends a unit
  with one line — always printed, progress on or off (a log gets one line per finished unit).
- ``enabled(flag)``: ``--progress`` / ``--no-progress`` as given, else on only when stdout and
  stderr are both terminals; ``add_arguments(parser)`` adds that pair to a command's parser.

Not on a terminal with progress on (``--progress``), each new step is one line. Not here: what
a step is (each command's own loop).
"""

from __future__ import annotations

import sys
import threading
import time


def enabled(flag: bool | None) -> bool:
    """``flag`` when given; else progress only for a person watching (stdout and stderr both
    terminals)."""
    if flag is not None:
        return bool(flag)
    return sys.stdout.isatty() and sys.stderr.isatty()


def add_arguments(parser) -> None:
    """``--progress`` / ``--no-progress`` (default: on a terminal only), as ``dest=progress``."""
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="no progress bar (for logs; a line per finished unit is still "
                          "printed; default: the bar is drawn only when stdout and stderr are "
                          "terminals)")
    bar.add_argument("--progress", dest="progress", action="store_true",
                     help="progress even when not on a terminal (one line per step)")


class Progress:
    """A tqdm bar over ``total`` units; the current step (timed) as its postfix."""

    def __init__(self, total: int | None, desc: str, enabled: bool, unit: str = "run"):
        from tqdm import tqdm

        self.enabled = enabled
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not enabled,
                        file=sys.stderr, dynamic_ncols=True)
        self.tty = enabled and sys.stderr.isatty()
        self._last_stage: str | None = None
        self._step: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None
        if self.tty:
            self._ticker = threading.Thread(target=self._tick, daemon=True,
                                            name="workbook-progress")
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._step is not None:
                    text, t0 = self._step
                    self.bar.set_postfix_str(f"{text} {time.monotonic() - t0:.0f} s")

    def set_postfix_str(self, text: str) -> None:
        with self._lock:
            self._step = None
            self.bar.set_postfix_str(text)

    def step(self, text: str) -> None:
        """The step running now, timed from here (a new line per step off a terminal)."""
        if not self.enabled:
            return
        with self._lock:
            self._step = (text, time.monotonic())
            if self.tty:
                self.bar.set_postfix_str(f"{text} 0 s")
                return
        if text != self._last_stage:
            self._last_stage = text
            self.bar.write(f"  {text}", file=sys.stderr)

    def stage(self, key: str, text: str) -> None:
        """The step running now, said by the caller (``text`` carries its own times)."""
        if not self.enabled:
            return
        if self.tty:
            self.set_postfix_str(text)
            return
        if key != self._last_stage:
            self._last_stage = key
            self.bar.write(f"  {text}", file=sys.stderr)

    def done(self, line: str | None = None, n: int = 1) -> None:
        """A unit finished: its line (printed progress on or off), the bar moves ``n``."""
        with self._lock:
            self._step = None
            if line:
                self.bar.write(line, file=sys.stderr)
            self.bar.update(n)
        self._last_stage = None

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
