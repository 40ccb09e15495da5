"""The constraints grid's command line: every choice for ``--help``, the exit codes, the line
per engine its progress prints.

``help_choices()`` reads ``environments/constraints.yaml`` (its entries, its axes with their
values, the default first) with the constraint faults and the modes, for the options' help
(``workbook run --help``, ``python -m workbook.run.constraints.grid --help``); ``EXIT_CODES`` /
``exit_code``: 0 every judged cell held, 1 a cell violated, 2 bad input (raised before, as
``ConfigError``), 3 no violation but the grid failed or a cell errored (as ``check-server
--constraints``), 128 + N a signal (the caller); ``engine_line``: one line per engine as it
ends (``workbook.core.progress``); ``Signals``: SIGINT and SIGTERM while a grid runs. Not here:
running the grid (``grid``).
"""

from __future__ import annotations

import signal
from collections import Counter

from workbook.core import rundir
from workbook.core.config import ConfigError
from workbook.run.constraints import axes as A
from workbook.run.constraints.plan import ENV, find


def engine_line(row: dict, cells: list) -> str:
    """One line per engine as it ends: method, points, status, cells by status, seconds."""
    n = Counter(c.status for c in cells)
    named = [x for x in row.get("points") or [] if x and x != A.label({})]
    pts = f" ({len(row['points'])} points)" if len(row.get("points") or []) > 1 else \
        f" @ {named[0]}" if named else ""
    said = ", ".join(f"{k} {st}" for st, k in sorted(n.items())) or "no cell"
    start = f", engine start {row['start_s']} s" if row.get("start_s") is not None else ""
    msg = f" — {str(row.get('message'))[:160]}" if row.get("status") != "ok" and \
        row.get("message") else ""
    return (f"{row['method']}{pts}: {row['status']}, {said} in {row.get('seconds', 0.0)} s"
            f"{start}{msg}")


EXIT_CODES = ("exit codes: 0 every judged cell held; 1 a cell was violated; 2 bad input "
              "(one line, before any engine starts); 3 no violation, but the grid failed or a "
              "cell errored (as check-server --constraints: 3 a request failed); 128 + N "
              "stopped by signal N (130 Ctrl-C), the run folder keeping what it had")


def exit_code(status: str, cells: list[dict]) -> int:
    """``EXIT_CODES`` from the manifest's status and the grid's cells (signals: the caller)."""
    st = {c.get("status") for c in cells}
    if "violated" in st:
        return 1
    return 3 if status != "ok" or "error" in st else 0


def help_choices(env: str = ENV) -> dict[str, str]:
    """Every choice the grid's options take, as help text: the environment's entries, the
    axes with their values (the default first), the constraint faults, the modes."""
    import yaml

    from workbook.core.config import MODES
    from workbook.core.constraint_fault_catalogue import FAULTS

    out = {"entries": "", "axes": "", "faults": ", ".join(FAULTS), "modes": ", ".join(MODES)}
    try:
        with open(find(env)) as f:
            raw = yaml.safe_load(f) or {}
        out["entries"] = ", ".join(r.get("name", "?") for r in raw.get("runs") or []
                                   if isinstance(r, dict))
        out["axes"] = "; ".join(f"{n}: {', '.join(a.values)}"
                                for n, a in A.parse(raw.get("axes")).items())
    except (OSError, ConfigError, yaml.YAMLError) as e:  # help never fails
        out["entries"] = out["axes"] = f"(environments/{env}.yaml unreadable: {e})"
    return out


class Interrupted(BaseException):  # not an Exception: no per-method handler swallows it
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGINT and SIGTERM while a grid runs (a context manager; main thread). Every signal is
    recorded (``received``): the first raises ``Interrupted`` where the grid is — and so does a
    second one while an engine stops —, and a signal a library turned into an error of its own
    (pydantic's schema build does) is still known. ``closing()``: the folder is being closed,
    later signals are only recorded. On exit the previous handlers come back, or, with
    ``last`` (the command ends with this grid) after a signal, every signal is ignored until the
    process exits (``rundir.ignore_late_signals``). A signal the caller ignores (a job started
    in the background: SIGINT) stays ignored."""

    def __init__(self, last: bool = False):
        self.last = last
        self.received: list[int] = []
        self._closing = False
        self._old: dict = {}

    def __enter__(self) -> "Signals":
        self._old = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)
                     if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def _stop(self, signum, frame):
        self.received.append(signum)
        if not self._closing:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise ``Interrupted`` when a signal came and was swallowed on its way."""
        if self.received:
            raise Interrupted(self.received[0])

    @property
    def name(self) -> str:
        return signal.Signals(self.received[0]).name

    def closing(self) -> None:
        self._closing = True

    def __exit__(self, *exc) -> bool:
        self._closing = True
        if self.received and self.last:
            rundir.ignore_late_signals()
        else:
            for s, h in self._old.items():
                signal.signal(s, h)
        return False
