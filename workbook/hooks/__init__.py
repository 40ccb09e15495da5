"""The workbook's hooks on MRV2, innermost first: a fault, the guard, the tracer, the watch.

``pre_start(cfg)`` installs what must be in place before the engine starts (the start-up
watch, start-up faults, the CPU profiling-run emulation); ``needs_pre_start(cfg)`` says whether
a configuration needs that (and so an engine of its own).

``install(cfg, engine)`` installs, for one configuration, what it asks for in this process and
returns the installed patch sets (remove them in reverse order) and the tracer, if any.
Inside vLLM's own processes the plugin (``workbook.hooks.plugin``) does the same from the
environment variables of ``workbook.vllm.env``.

Layering (``workbook.vllm.patching``): vLLM's original < fault < guard < trace, so the tracer
always observes what the guard finally emits and the guard what a (simulated) broken vLLM
produced. Rooms, one folder per concern: ``observe/`` (the observer and its collectors: tracer,
outputs, row check, served rows, preemption counter, steer), ``guard/`` (the fix), ``watch/``
(the start-up watch and everything that names a writer), ``faults/`` (budget and constraint
faults; the lowest room, which ``observe`` and ``watch`` build on); ``plugin`` (the
``vllm.general_plugins`` entry point) at the root beside this front door.
"""

from __future__ import annotations


def install(cfg, engine=None, *, trace_dir: str | None = None):
    """Install ``cfg``'s fault, constraint fault, guard and ONE observer (``hooks.observer``)
    with the collectors it asks for (the outputs, the row check, the tracer); returns (patch sets, tracer
    or None); the row check, when asked for, is the observer's (``row_check(hooks)`` finds it). A start-up fault (``before_start``) is not installed
    here: ``pre_start`` did."""
    from workbook.core.hypotheses import FAULTS

    hooks = []
    tracer = None
    if cfg.fault and cfg.fault != "none" and not FAULTS[cfg.fault].before_start:
        from workbook.hooks.faults import budget as faults

        hooks.append(faults.inject(cfg.fault, engine=engine))
    if getattr(cfg, "constraint_fault", "none") != "none":
        from workbook.hooks.faults import constraints as constraint_faults

        hooks.append(constraint_faults.inject(cfg.constraint_fault))
    if cfg.guard:
        from workbook.hooks import guard

        hooks.append(guard.install())
    collectors = []  # one observer: every collector on the same hook points
    if cfg.trace or getattr(cfg, "row_check", False):  # the outputs both read, recorded once
        from workbook.hooks.observe.outputs import Outputs

        collectors.append(Outputs())
    if getattr(cfg, "row_check", False):
        from workbook.hooks.observe.rowcheck import RowCheck

        collectors.append(RowCheck())
    if cfg.trace:
        from workbook.hooks.observe.tracer import Tracer

        tracer = Tracer(flush_dir=trace_dir)
        collectors.append(tracer)
    if collectors:
        from workbook.hooks.observe.observer import Observer

        hooks.append(Observer(collectors).install())
    return hooks, tracer


def row_check(hooks):
    """The row check among ``install``'s patch sets (None when the run asked for none)."""
    from workbook.hooks.observe.observer import Observer
    from workbook.hooks.observe.rowcheck import RowCheck

    return next((h.collector(RowCheck) for h in hooks if isinstance(h, Observer)
                 and h.collector(RowCheck) is not None), None)


def needs_pre_start(cfg) -> bool:
    """Whether ``cfg`` needs hooks in place before its engine starts (then its own engine)."""
    from workbook.core.hypotheses import FAULTS

    f = FAULTS.get(cfg.fault)
    return bool(cfg.watched or cfg.cpu_profile_run or cfg.sampler_warmup or
                (f is not None and f.before_start))


def watch_options(cfg, out_dir: str | None = None, **kw):
    """The ``workbook.hooks.watch.Options`` of a configuration."""
    from workbook.hooks.watch import Options

    return Options(out_dir=out_dir, localize=cfg.localize, localize_within=cfg.localize_within,
                   localize_timeout_s=float(cfg.localize_timeout_s), protect=cfg.sanitize, **kw)


def pre_start(cfg, *, watch_dir: str | None = None):
    """Before ``vllm.LLM(...)`` (vLLM imported, no engine yet): the CPU profiling-run
    emulation, the start-up watch and a start-up fault, as ``cfg`` asks. Returns
    (patch sets, watch or None, after_start): the watch binds to the next runner built in
    this process; call ``after_start()`` once that engine is up (it removes what only the
    start-up needs, so later engines of the process start as vLLM would)."""
    from workbook.core.hypotheses import FAULTS

    sets, w, startup_only = [], None, []
    if cfg.cpu_profile_run:
        from workbook.hooks import watch as wmod

        ps = wmod.force_cpu_profile_run()
        if ps is not None:
            startup_only.append(ps)
    if cfg.sampler_warmup:
        from workbook.hooks.watch import window

        startup_only.append(window.sampler_warmup().install())
    if cfg.watched:
        from workbook.hooks import watch as wmod

        w = wmod.install(watch_options(cfg, watch_dir))
    f = FAULTS.get(cfg.fault)
    if f is not None and f.before_start:
        from workbook.hooks.faults import budget as faults

        sets.append(faults.inject(cfg.fault))

    def after_start():
        for ps in startup_only:
            ps.remove()

    return sets, w, after_start
