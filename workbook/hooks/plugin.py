"""vLLM ``general_plugins`` entry point: install workbook hooks inside every vLLM process.

vLLM loads ``vllm.general_plugins`` entry points in the front-end, the engine core and every
worker process. ``register()`` reads the variables of ``workbook.vllm.env`` (``HOOK_VARS``)
and installs, in that process, what they ask for:

- ``WORKBOOK_FAULT=H-x``      inject that fault (``workbook.hooks.faults.budget``)
- ``WORKBOOK_GUARD=1``        apply the budget guard (``workbook.hooks.guard``)
- ``WORKBOOK_TRACE_DIR=path`` trace into ``path/<pid>/``; flushed at exit and every
  ``WORKBOOK_TRACE_FLUSH_EVERY`` steps (``workbook.run.server`` asks for every step: the
  server's engine process is killed at shutdown)
- ``WORKBOOK_EFFECTIVE_DIR=path`` write ``path/<pid>/effective.json`` on a model runner's first
  requests (``workbook.vllm.effective.effective_writer``)
- ``WORKBOOK_WATCH_DIR=path`` the start-up watch (``workbook.hooks.watch``): options from
  ``path/options.json``, evidence in ``path/<pid>/watch.json``. It goes in at model-runner
  import, before any runner is built, so it sees the whole start-up; worker classes are wrapped
  when the runner is built (their modules are still importing when this hook runs)
- ``WORKBOOK_CPU_PROFILE_RUN=1`` the CPU worker runs ``profile_run`` as the GPU worker does
- ``WORKBOOK_ROW_CHECK_DIR=path`` the served constraints grid's row check and constraint fault
  (``workbook.hooks.observe.served_rows``: ``path/control.json`` in, ``path/<pid>/rows.jsonl`` out)

With tensor or pipeline parallelism every worker process (one per rank) loads the plugin and
installs the same hooks; when its runner is built it writes ``<dir>/<pid>/rank.json`` (tp / pp
rank, world, whether it samples) next to its trace and watch evidence, so every piece of
evidence names its rank (``workbook.core.tracefiles.load`` adds the columns; docs/parallel.md).

With none of them set it does nothing, so having the package installed never changes vLLM.
The hooks go in when the process first imports a model-runner module (``RUNNER_MODULES``), so
processes that never run a model (the OpenAI front-end, the engine core) stay untouched and
skip ~14 s of imports. A traced process that forks re-points the inherited tracer at the
child's own ``<pid>/`` folder.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

from workbook.vllm import env as wenv

_installed_from_env = False

# The hooks patch model-runner classes only. A process installs them when it first imports one
# of these modules (at once if it already has).
RUNNER_MODULES = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner")


def register() -> None:
    if wenv.hooks_requested():
        install_from_env()


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
    dirs = [os.environ.get(k) for k in (wenv.TRACE_DIR, wenv.WATCH_DIR, wenv.EFFECTIVE_DIR)]
    if any(dirs):
        _when_runner_built(lambda: _write_rank([d for d in dirs if d]))
    if os.environ.get(wenv.CPU_PROFILE_RUN) == "1":
        _when_runner_built(_force_cpu_profile_run)
    watch_dir = os.environ.get(wenv.WATCH_DIR)
    if watch_dir:
        from workbook.hooks import watch

        watch.install_from_dir(watch_dir)
    fault = os.environ.get(wenv.FAULT)
    if fault and fault != "none":
        from workbook.hooks.faults import budget as faults

        only = wenv.fault_ranks()
        if only is None:
            faults.inject(fault, engine=None)
        else:  # one rank's fault: planted once this process knows its rank, before any step
            _when_runner_built(lambda: rank_info()["tp_rank"] in only and
                               faults.inject(fault, engine=None))
    if os.environ.get(wenv.GUARD) == "1":
        from workbook.hooks import guard

        guard.install()
        _when_runner_built(_RUNNERS.append, with_runner=True)
    rows_dir = os.environ.get(wenv.ROW_CHECK_DIR)
    if rows_dir:
        from workbook.hooks.observe import served_rows

        served_rows.install_from_dir(rows_dir)
    trace_dir = os.environ.get(wenv.TRACE_DIR)
    if trace_dir:
        import atexit

        from workbook.hooks.observe.tracer import Tracer

        every = int(os.environ.get(wenv.TRACE_FLUSH_EVERY) or 64)
        tracer = Tracer(flush_dir=os.path.join(trace_dir, str(os.getpid())),
                        flush_every=max(1, every)).install()
        if os.environ.get(wenv.GUARD) == "1":
            _guard_report_on_flush(tracer)
        atexit.register(tracer.flush)
        os.register_at_fork(after_in_child=lambda: _repoint(tracer, trace_dir))
    effective_dir = os.environ.get(wenv.EFFECTIVE_DIR)
    if effective_dir:
        from workbook.vllm.effective import effective_writer

        effective_writer(effective_dir)


def rank_info() -> dict:
    """This process's place in vLLM's parallel layout (read from vLLM's own groups; a process
    without them is rank 0 of 1). Only the last pipeline stage samples (MRV2
    ``GPUModelRunner.sample_tokens``); every tensor-parallel rank of it samples the same rows
    with its own ``ThinkingBudgetState``."""
    info = {"pid": os.getpid(), "tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1}
    try:
        from vllm.distributed import parallel_state as ps

        tp, pp = ps.get_tp_group(), ps.get_pp_group()
        info.update(tp_rank=tp.rank_in_group, tp_size=tp.world_size,
                    pp_rank=pp.rank_in_group, pp_size=pp.world_size)
    except Exception as e:  # no distributed groups in this process (a single in-process rank)
        info["groups"] = f"{type(e).__name__}: {e}"[:200]
    info["samples"] = info["pp_rank"] == info["pp_size"] - 1
    return info


def _write_rank(dirs) -> None:
    import json

    info = rank_info()
    for d in dirs:
        folder = os.path.join(d, str(os.getpid()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "rank.json"), "w") as f:
            json.dump(info, f)


_RUNNERS: list = []  # the MRV2 runners built in this process (the guard's report reads them)
GUARD_FILE = "guard.json"  # <trace dir>/<pid>/guard.json: this rank's guard report


def _guard_report_on_flush(tracer) -> None:
    """Each flush of this rank's trace also writes its guard's report (``guard.report``: the
    tokens it replaced, the fields of its own state it repaired, with their requests) next to
    it, so every rank's guard evidence reaches the run folder (``workbook.core.ranks``)."""
    flush = tracer.flush

    def flush_with_guard():
        flush()
        if _RUNNERS and tracer.flush_dir:
            write_guard_report(_RUNNERS[0], tracer.flush_dir)
    tracer.flush = flush_with_guard


def write_guard_report(runner, folder: str) -> None:
    import json

    from workbook.hooks import guard

    try:
        rep = guard.report(runner)
    except Exception as e:  # the report must never break the worker's step
        rep = {"error": f"{type(e).__name__}: {e}"[:300]}
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, GUARD_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(rep, f)
    os.replace(tmp, os.path.join(folder, GUARD_FILE))


def _force_cpu_profile_run() -> None:
    from workbook.hooks import watch

    watch.force_cpu_profile_run()


def _when_runner_built(fn, with_runner: bool = False) -> None:
    """Run ``fn()`` once, when the first MRV2 runner is constructed (the worker modules have
    finished importing by then); ``with_runner``: ``fn(runner)`` once it is built."""
    from workbook.vllm import hookpoints
    from workbook.vllm.patching import PatchSet

    ps = PatchSet("plugin:runner-built", "watch")
    done = []

    def make(orig):
        def __init__(self, *a, **k):
            first = not done
            if first:
                done.append(1)
                if not with_runner:
                    fn()
            out = orig(self, *a, **k)
            if first and with_runner:
                fn(self)
            return out
        return __init__

    ps.wrap(hookpoints.resolve().runner, "__init__", make)
    ps.install()


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
