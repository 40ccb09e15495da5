"""Shared fixtures: real in-process vLLM engines on the tiny CPU models, started once per session.

vLLM allows several in-process engines in one Python process; each configuration is started the
first time a test asks for it (20–60 s on a 2-core CPU, ~1 s for later ones) and kept for the
session. Hooks (tracer, faults, guard) are installed and removed per test, so one engine serves
them all.
"""

from __future__ import annotations

import gzip
import os
import signal

import pytest

from workbook.core.config import RunConfig
from workbook.vllm import engine as _engine

_ENGINES: dict[tuple, object] = {}

# The Ctrl-C tests send SIGINT to the commands they start. A suite started in the background
# (`... &` in a script: the shell ignores SIGINT there, and every child inherits the ignore)
# would leave those commands deaf to it; a handler here is reset to the default at each exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def get_engine(**overrides):
    key = tuple(sorted(overrides.items()))
    if key not in _ENGINES:
        _ENGINES[key] = _engine.start(RunConfig(**overrides))
    return _ENGINES[key]


@pytest.fixture(scope="session")
def engines():
    """``engines(spec_method="eagle")`` → a started ``workbook.vllm.engine.Engine``."""
    return get_engine


def evidence_text(path: str) -> str:
    """A committed evidence file's text: ``path``, or ``path.gz`` as ``scripts/lean_outputs.py``
    keeps a bulky one."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rt", errors="replace") as f:
            return f.read()
    with open(path, errors="replace") as f:
        return f.read()


def evidence_json(path: str):
    import json

    return json.loads(evidence_text(path))
