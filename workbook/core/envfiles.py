"""Where an environment name points: ``cpu`` -> ``environments/cpu.yaml`` (the working folder
first, then the repository), or a path; the names that resolve. One place for the lookup that
the batch layer and the constraints grid both use. Deliberately not here: reading or validating
an environment (``workbook.batch.environment``, ``workbook.run.constraints.grid``).
"""

from __future__ import annotations

import os

from workbook.core.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_environment(name: str) -> str:
    """``cpu`` -> ``environments/cpu.yaml`` (cwd first, then the repository); or a path."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    for root in (os.getcwd(), REPO):
        p = os.path.join(root, "environments", f"{name}.yaml")
        if os.path.isfile(p):
            return p
    raise ConfigError(f"no environment {name!r}: neither a file nor environments/{name}.yaml; "
                      f"environments: {', '.join(environment_names()) or 'none found'}")


def environment_names() -> list[str]:
    """The names ``find_environment`` resolves (``environments/*.yaml``, cwd and repository)."""
    found = set()
    for root in (os.getcwd(), REPO):
        d = os.path.join(root, "environments")
        if os.path.isdir(d):
            found |= {f[:-5] for f in os.listdir(d) if f.endswith(".yaml")}
    return sorted(found)
