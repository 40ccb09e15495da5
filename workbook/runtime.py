"""Install the workbook's hooks for one configuration: fault, guard, tracer (in that order).

``install(cfg, engine)`` is used in-process; ``install_from_env()`` is what the
``vllm.general_plugins`` entry point (``workbook.plugin``) calls inside vLLM's own processes,
driven by environment variables:

- ``WORKBOOK_FAULT=H-x``      inject that hypothesis' fault (``workbook.faults``)
- ``WORKBOOK_GUARD=1``        apply the budget guard (``workbook.guard``)
- ``WORKBOOK_TRACE_DIR=path`` trace into ``path/<pid>/`` (``workbook.trace``); flushed at exit

Returns the installed patch sets (remove them in reverse order) and the tracer, if any.
"""

from __future__ import annotations

import os


def install(cfg, engine=None):
    hooks = []
    tracer = None
    if cfg.fault and cfg.fault != "none":
        from workbook import faults

        hooks.append(faults.inject(cfg.fault, engine=engine))
    if cfg.guard:
        from workbook import guard

        hooks.append(guard.install())
    if cfg.trace:
        from workbook.trace import Tracer

        tracer = Tracer().install()
        hooks.append(tracer)
    return hooks, tracer


def env_for(cfg, trace_dir: str | None) -> dict[str, str]:
    """Environment variables that make the plugin install ``cfg``'s hooks in vLLM processes."""
    env = {}
    if cfg.fault and cfg.fault != "none":
        env["WORKBOOK_FAULT"] = cfg.fault
    if cfg.guard:
        env["WORKBOOK_GUARD"] = "1"
    if cfg.trace and trace_dir:
        env["WORKBOOK_TRACE_DIR"] = trace_dir
    return env


_installed_from_env = False


def install_from_env() -> None:
    """Called by the plugin in every vLLM process; idempotent."""
    global _installed_from_env
    if _installed_from_env:
        return
    _installed_from_env = True
    fault = os.environ.get("WORKBOOK_FAULT")
    if fault and fault != "none":
        from workbook import faults

        faults.inject(fault, engine=None)
    if os.environ.get("WORKBOOK_GUARD") == "1":
        from workbook import guard

        guard.install()
    trace_dir = os.environ.get("WORKBOOK_TRACE_DIR")
    if trace_dir:
        import atexit

        from workbook.trace import Tracer

        tracer = Tracer(flush_dir=os.path.join(trace_dir, str(os.getpid()))).install()
        atexit.register(tracer.flush)
