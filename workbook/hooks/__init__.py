"""The workbook's hooks on MRV2, innermost first: a fault, the guard, the tracer, the watch.

``install(cfg, engine)`` installs, for one configuration, what it asks for in this process and
returns the installed patch sets (remove them in reverse order) and the tracer, if any.
Inside vLLM's own processes the plugin (``workbook.hooks.plugin``) does the same from the
environment variables of ``workbook.vllm.env``.

Layering (``workbook.vllm.patching``): vLLM's original < fault < guard < trace, so the tracer
always observes what the guard finally emits and the guard what a (simulated) broken vLLM
produced. Modules: ``tracer`` (per-step evidence), ``faults`` (one per catalogue entry),
``guard`` (the fix), ``plugin`` (the ``vllm.general_plugins`` entry point).
"""

from __future__ import annotations


def install(cfg, engine=None, *, trace_dir: str | None = None):
    """Install ``cfg``'s fault, guard and tracer; returns (patch sets, tracer or None)."""
    hooks = []
    tracer = None
    if cfg.fault and cfg.fault != "none":
        from workbook.hooks import faults

        hooks.append(faults.inject(cfg.fault, engine=engine))
    if cfg.guard:
        from workbook.hooks import guard

        hooks.append(guard.install())
    if cfg.trace:
        from workbook.hooks.tracer import Tracer

        tracer = Tracer(flush_dir=trace_dir).install()
        hooks.append(tracer)
    return hooks, tracer
