"""Install the workbook's hooks for one configuration: fault, guard, tracer (in that order).

``install(cfg, engine)`` is used in-process; ``install_from_env()`` is what the
``vllm.general_plugins`` entry point (``workbook.plugin``) calls inside vLLM's own processes,
driven by environment variables:

- ``WORKBOOK_FAULT=H-x``      inject that hypothesis' fault (``workbook.faults``)
- ``WORKBOOK_GUARD=1``        apply the budget guard (``workbook.guard``)
- ``WORKBOOK_TRACE_DIR=path`` trace into ``path/<pid>/`` (``workbook.trace``); flushed at exit
- ``WORKBOOK_TRACE_FLUSH_EVERY=n`` flush the trace every ``n`` steps (the OpenAI server's engine
  process is killed at shutdown, so ``workbook.server`` asks for every step)
- ``WORKBOOK_EFFECTIVE_DIR=path`` on the first ``add_requests`` of a model runner, write
  ``path/<pid>/effective.json``: the runner-side effective configuration (``worker_effective``)

The hooks go in when the process first imports a model-runner module (``RUNNER_MODULES``), so
processes that never run a model (the OpenAI front-end, the engine core) stay untouched. A
traced process that forks re-points the inherited tracer at the child's own ``<pid>/`` folder.

Returns the installed patch sets (remove them in reverse order) and the tracer, if any.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


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


# The hooks patch model-runner classes only. A process installs them when it first imports one
# of these modules (at once if it already has): the server's front-end and the engine-core
# process never do, and skip ~14 s of imports each (see ``_after_import``).
RUNNER_MODULES = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner")


def install_from_env() -> None:
    """Called by the plugin in every vLLM process; idempotent. Installs the hooks now if this
    process already imported a model-runner module, else right after it imports one."""
    global _installed_from_env
    if _installed_from_env:
        return
    _installed_from_env = True
    if any(m in sys.modules for m in RUNNER_MODULES):
        _install_hooks_from_env()
    else:
        _after_import(RUNNER_MODULES, _install_hooks_from_env)


def _install_hooks_from_env() -> None:
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

        every = int(os.environ.get("WORKBOOK_TRACE_FLUSH_EVERY") or 64)
        tracer = Tracer(flush_dir=os.path.join(trace_dir, str(os.getpid())),
                        flush_every=max(1, every)).install()
        atexit.register(tracer.flush)
        os.register_at_fork(after_in_child=lambda: _repoint(tracer, trace_dir))
    effective_dir = os.environ.get("WORKBOOK_EFFECTIVE_DIR")
    if effective_dir:
        effective_writer(effective_dir)


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot import hook: run ``fn()`` once, right after the first of ``names`` is loaded."""

    def __init__(self, names, fn):
        self.names = set(names)
        self.fn = fn

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            self.fn()  # cannot wrap this loader: install before the module loads
            return spec
        loader, fn = spec.loader, self.fn
        load = loader.exec_module

        def exec_module(module):
            load(module)
            fn()
        loader.exec_module = exec_module
        return spec


def _after_import(names, fn) -> None:
    def guarded():
        try:
            fn()
        except Exception as e:  # a broken hook must be loud, but not break vLLM's import
            import traceback

            print(f"workbook: installing hooks failed in pid {os.getpid()}: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc()
    sys.meta_path.insert(0, _AfterImport(names, guarded))


def _repoint(tracer, trace_dir: str) -> None:
    tracer.flush_dir = os.path.join(trace_dir, str(os.getpid()))


# --- runner-side effective configuration (for engines in other processes: the server) --------

def worker_effective(runner) -> dict:
    """The keys of ``engine.effective_config``, read inside the process that owns ``runner``.

    (``effective_config`` needs the in-process ``LLM``; this reads the same facts from the
    runner's ``vllm_config``. Log lines are not visible here: ``workbook.server`` adds them
    from the server log.)
    """
    from workbook import engine

    eff = engine.config_facts(runner.vllm_config)
    eff["pid"] = os.getpid()
    eff.update(engine.runner_facts(runner))
    return eff


def effective_writer(out_dir: str):
    """Patch set writing ``out_dir/<pid>/effective.json`` once, when a model runner first gets
    requests: MRV2's ``add_requests``, and V1's ``_update_states`` (so a run that silently
    fell back to V1, hypothesis H-h, still says which runner served it)."""
    from workbook import hookpoints, patching

    written: set[int] = set()

    def make(orig):
        def first_requests(runner, *a, **k):
            out = orig(runner, *a, **k)
            if os.getpid() not in written:
                written.add(os.getpid())
                _write_effective(runner, os.path.join(out_dir, str(os.getpid())))
            return out
        return first_requests

    ps = patching.PatchSet("effective", "trace")
    ps.wrap(hookpoints.resolve().runner, "add_requests", make)
    v1 = _v1_runner_class()
    if v1 is not None:
        ps.wrap(v1, "_update_states", make)
    return ps.install()


def _v1_runner_class():
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:  # 0.34+: V1 is gone
        return None
    return GPUModelRunner if hasattr(GPUModelRunner, "_update_states") else None


def _write_effective(runner, folder: str) -> None:
    from workbook.investigate import write_json

    try:
        eff = worker_effective(runner)
    except Exception as e:  # never break the engine; say what failed instead
        eff = {"error": f"{type(e).__name__}: {e}", "pid": os.getpid()}
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, "effective.json"), eff)
