"""vLLM ``general_plugins`` entry point: install workbook hooks inside every vLLM process.

vLLM loads ``vllm.general_plugins`` entry points in the front-end, the engine core and every
worker process. ``register()`` reads environment variables set by the workbook and installs,
in that process, what they ask for: the tracer (``WORKBOOK_TRACE_DIR``), a fault
(``WORKBOOK_FAULT``), the budget guard (``WORKBOOK_GUARD=1``) and the effective-configuration
writer (``WORKBOOK_EFFECTIVE_DIR``). With none of them set it does
nothing, so having the package installed never changes vLLM.
"""

from __future__ import annotations

import os


def register() -> None:
    if not any(os.environ.get(k) for k in ("WORKBOOK_TRACE_DIR", "WORKBOOK_FAULT",
                                           "WORKBOOK_GUARD", "WORKBOOK_EFFECTIVE_DIR")):
        return
    from workbook import runtime

    runtime.install_from_env()
