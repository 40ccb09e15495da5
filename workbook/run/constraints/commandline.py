"""The constraints grid's command line: every choice for ``--help``, the exit codes, the line
per engine its progress prints.

``help_choices()`` reads ``environments/constraints.yaml`` (its entries, its axes with their
values, the default first) with the constraint faults and the modes, for the options' help
(``workbook run --help``, ``python -m workbook.run.constraints.grid --help``); ``EXIT_CODES`` /
``exit_code``: 0 every judged cell held, 1 a cell violated, 2 bad input (raised before, as
``ConfigError``), 3 no violation but the grid failed or a cell errored (as ``check-server
--constraints``), 128 + N a signal (the caller); ``engine_line``: one line per engine as it
ends (``workbook.core.progress``). Not here: running the grid (``grid``).
"""

from __future__ import annotations

from collections import Counter

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
