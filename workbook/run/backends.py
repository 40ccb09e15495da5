"""The two ways the pipeline reaches vLLM: an in-process engine, or ``vllm serve``.

A backend does, for ``workbook.run.pipeline``: ``start()`` (engine / server up, hooks in),
``effective()``, ``reported()`` (the reported request → ``Outcome`` list), ``check(name)``,
``frames(n_tokens)`` (the trace of this run's requests), ``stop()`` (hooks out / server
down), ``save_files(outdir)`` (its own evidence: ``server.log``), ``timings`` and ``handle``
(the ``Engine`` or ``Server``, for a notebook that explores further).

``BACKENDS`` maps ``RunConfig.mode`` to the class. Not here: the steps and the evidence files
(``pipeline``), the server process itself (``server``), the request (``request``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time

from workbook import hooks
from workbook.run import request
from workbook.run import server as srv
from workbook.vllm import engine


class _Own:
    """An engine started with pre-start hooks (``workbook.hooks.pre_start``): the watch and
    start-up faults stay bound to it for its life."""

    def __init__(self, eng, watch, sets, first_run: str | None):
        self.engine, self.watch, self.sets, self.first_run = eng, watch, sets, first_run
        self.runs = 0


_OWN: dict[str, _Own] = {}


def own_engine(cfg, outdir=None) -> tuple[_Own, bool]:
    """The engine of a configuration that needs pre-start hooks: started with them the first
    time (its watch writing progressively into ``outdir/watch/``), reused afterwards (then the
    reusing run did not observe the start-up). Returns (it, started now)."""
    key = engine.engine_key(cfg, cfg.fault, cfg.watched, cfg.localize, cfg.localize_within,
                            cfg.cpu_profile_run)
    if key in _OWN:
        return _OWN[key], False
    box: dict = {}

    def before():
        box["sets"], box["watch"], box["after"] = hooks.pre_start(
            cfg, watch_dir=os.path.join(outdir, "watch") if outdir else None)

    try:
        eng = engine.start(cfg, log=os.path.join(outdir, "vllm.log") if outdir else None,
                           before_start=before)
    except BaseException:
        if box.get("watch") is not None:
            box["watch"].remove()  # never let it bind to a later engine
        raise
    finally:
        if "after" in box:
            box["after"]()
    w = box.get("watch")
    if w is not None and w.runner is None:  # no MRV2 runner was built (e.g. a V1 fallback)
        w.error = "no Model Runner V2 was built by this engine: nothing was watched"
        w.remove()
    own = _OWN[key] = _Own(eng, box.get("watch"), box.get("sets", []), outdir)
    return own, True


_RANKED: dict[str, tuple] = {}


def ranked_engine(cfg, outdir=None):
    """An engine with several ranks (tensor / pipeline parallel): vLLM runs the model in worker
    processes, so the hooks go in there through the plugin (the same install as ``vllm
    serve``), set in this process's environment for the start only; each rank traces into
    ``<dir>/<pid>/`` with its ``rank.json``. One engine per configuration and hook set."""
    import tempfile

    from workbook.vllm import env as wenv

    from workbook.core.config import ConfigError

    try:
        only = wenv.fault_ranks()  # a one-rank fault (docs/parallel.md): checked before the start
    except ValueError as e:
        raise ConfigError(str(e)) from None
    key = engine.engine_key(cfg, cfg.fault, cfg.guard, cfg.trace, cfg.watched, "ranks",
                            sorted(only) if only is not None else None)
    if key in _RANKED:
        return _RANKED[key]
    trace_dir = tempfile.mkdtemp(prefix="workbook-ranks-")
    watch_dir = None
    if cfg.watched:  # every rank watches its own copy of the state: <watch dir>/<pid>/
        from workbook.hooks import watch as wmod

        watch_dir = os.path.join(trace_dir, "watch")
        wmod.write_options(watch_dir, hooks.watch_options(cfg, flush_every_steps=1).to_dict())
    hook = wenv.hook_env(cfg, trace_dir=trace_dir, watch_dir=watch_dir, flush_every=1)
    saved = {k: os.environ.get(k) for k in hook}
    wenv.apply(hook)
    try:
        eng = engine.start(cfg, log=os.path.join(outdir, "vllm.log") if outdir else None)
    finally:
        wenv.apply(saved)  # later engines of this process start as vLLM would
    _RANKED[key] = (eng, trace_dir)
    return _RANKED[key]


def world_size(cfg) -> int:
    return getattr(cfg, "tensor_parallel_size", 1) * getattr(cfg, "pipeline_parallel_size", 1)


class _RankGuards:
    """Each rank's guard report (``<rank_dir>/<pid>/guard.json``, written by the plugin with
    every trace flush) restricted to this run: the one reader for the in-process backend with
    several ranks and the served one (``rank_dir``: where the workers write; None: no ranks)."""

    rank_dir: str | None = None

    def _rank_guard_raw(self) -> dict:
        from workbook.core import ranks
        from workbook.hooks.plugin import GUARD_FILE

        return ranks.read_per_rank(self.rank_dir, GUARD_FILE) \
            if self.cfg.guard and self.rank_dir else {}

    def rank_guards(self) -> dict:
        """This run's guard report per rank (counters since the run began, its requests:
        ``ranks.guard_of_run``)."""
        from workbook.core import ranks

        before = getattr(self, "guard_before", {})
        return {lab: ranks.guard_of_run(r, before.get(lab), self.before)
                for lab, r in self._rank_guard_raw().items()}


class InProcess(_RankGuards):
    """vLLM in this process (``vllm.LLM``), shared with every run of the same engine
    configuration; the run's fault, guard and tracer installed for the run only. A
    configuration with pre-start hooks (the start-up watch, a start-up fault) gets an engine
    of its own, started with them (``own_engine``)."""

    name = "in-process"

    def __init__(self, cfg, outdir=None, engine=None):
        self.cfg = cfg
        self.outdir = outdir
        # a given (shared) engine, seen with this run's request parameters
        self.engine = None if engine is None else dataclasses.replace(engine, cfg=cfg)
        self.own: _Own | None = None
        self.started_own = False
        self.hooks: list = []
        self.tracer = None
        self.timings: dict[str, float] = {}
        self.rank_dir: str | None = None  # several ranks: their traces (ranked_engine)
        self.before: set = set()
        self.agreement: dict | None = None

    @property
    def handle(self):
        return self.engine

    def start(self) -> None:
        if self.engine is None and world_size(self.cfg) > 1:
            from workbook.core import tracefiles
            from workbook.run import server as srv_

            eng, self.rank_dir = ranked_engine(self.cfg, self.outdir)
            self.started_own = self.cfg.watched and not getattr(eng, "_wb_runs", 0)
            eng._wb_runs = getattr(eng, "_wb_runs", 0) + 1
            self.timings.update(eng.timings)
            self.engine = dataclasses.replace(eng, cfg=self.cfg)
            self.before = srv_.traced_req_ids(tracefiles.load(self.rank_dir))
            self.guard_before = self._rank_guard_raw()
            return
        if self.engine is None:
            if hooks.needs_pre_start(self.cfg):
                self.own, self.started_own = own_engine(self.cfg, self.outdir)
                self.own.runs += 1
                self.timings.update(self.own.engine.timings)
                self.engine = dataclasses.replace(self.own.engine, cfg=self.cfg)
            else:
                shared = engine.shared(self.cfg, log=os.path.join(self.outdir, "vllm.log")
                                       if self.outdir else None)
                self.timings.update(shared.timings)
                # the shared vLLM engine, seen with this run's request parameters (budget,
                # prompt, sampling): a shared engine keeps the configuration it started with
                self.engine = dataclasses.replace(shared, cfg=self.cfg)
        self.hooks, self.tracer = hooks.install(self.cfg, engine=self.engine)

    def watch(self) -> dict | None:
        """The start-up watch's evidence (None without a watch); several ranks: the reference
        rank's with every rank's under ``ranks`` (``rank_watch``)."""
        if self.rank_dir is not None:
            return self.rank_watch()
        w = self.own.watch if self.own is not None else None
        if w is None:
            return None
        data = w.read()
        data["startup_observed"] = self.started_own
        if not self.started_own:
            data["startup_note"] = ("engine reused: its start-up was observed by an earlier run "
                                    f"({self.own.first_run or 'in memory'}); the start-up "
                                    "evidence below is that run's")
        return data

    def effective(self) -> dict:
        return dict(self.engine.effective)

    def _weights(self):
        return request.zeroed_lm_head(self.engine) if self.cfg.zero_lm_head \
            else contextlib.nullcontext()

    def reported(self) -> list:
        with self._weights():
            return request.run_reported(self.engine)

    def check(self, name: str) -> list:
        return request.CHECKS[name](self.engine)

    def frames(self, n_tokens: int) -> dict:
        if getattr(self, "rank_dir", None):
            return self._rank_frames()
        return self.tracer.frames() if self.tracer is not None else {}

    def _rank_frames(self) -> dict:
        """This run's rows from every rank; the verdict's tables are the reference sampling
        rank's, the others checked against it (``workbook.core.ranks.agreement``)."""
        from workbook.core import ranks, tracefiles

        time.sleep(1.0)  # each rank flushes after every step
        frames = tracefiles.load(self.rank_dir)
        for name, df in list(frames.items()):
            if "req_id" in getattr(df, "columns", ()) and self.before:
                frames[name] = df[~df["req_id"].isin(self.before)].reset_index(drop=True)
        self.agreement = ranks.agreement(frames) if ranks.has_ranks(frames) else \
            {"ranks": [], "agree": False, "why": "no rank.json was written by vLLM's workers"}
        if ranks.has_ranks(frames) and self.agreement["ranks"]:
            p, t = ranks.sampling_ranks(frames)[0]
            return ranks.of_rank(frames, p, t)
        return frames

    # -- several ranks: each rank's guard report and start-up watch (docs/parallel.md)
    def rank_watch(self) -> dict | None:
        if not self.cfg.watched:
            return None
        from workbook.core import ranks

        per = {}
        for _ in range(20):  # each rank writes after every step (flush_every_steps=1)
            per = ranks.read_per_rank(os.path.join(self.rank_dir, "watch"), "watch.json")
            if per and all(w.get("steps", {}).get("real_steps", 0) > 0 for w in per.values()):
                break
            time.sleep(0.5)
        if not per:
            return None
        for w in per.values():
            w["startup_observed"] = self.started_own
        ref = next(iter(per.values()))
        return {**ref, "rank": next(iter(per)), "ranks": per}

    def stop(self) -> None:
        for h in reversed(self.hooks):
            h.remove()
        self.hooks = []

    def save_files(self, outdir: str) -> None:
        """A run that reused an engine started elsewhere (without this run's folder, e.g. a
        notebook's session) still gets that engine's start-up log as its ``vllm.log``."""
        src = getattr(self.engine, "log", None)
        dst = os.path.join(outdir, "vllm.log")
        if src and os.path.exists(src) and not os.path.exists(dst):
            with open(src, errors="replace") as f, open(dst, "w") as g:
                g.write(f"# vLLM's start-up log of the engine this run reused (started earlier "
                        f"in this process, logged to {src})\n" + f.read())
        agreement = getattr(self, "agreement", None)
        if agreement is not None:
            from workbook.core import rundir

            rundir.write_json(os.path.join(outdir, "ranks.json"), agreement)
            shutil.copytree(self.rank_dir, os.path.join(outdir, "trace-ranks"),
                            dirs_exist_ok=True)


class Served(_RankGuards):
    """The reported request through vLLM's OpenAI-compatible server, as #54906 was reported.

    Hooks reach vLLM's processes through the plugin; with ``server`` (a running
    ``workbook.run.server.Server`` for the same engine configuration) it is reused and left
    running, and the run reads only the traces of the requests it sent."""

    name = "server"

    def __init__(self, cfg, outdir=None, server=None, port=None):
        self.cfg = cfg
        self.own = server is None
        self.server = server or srv.Server(cfg, outdir, port=port)
        self.before: set = set()
        self.timings: dict[str, float] = {}
        self._sent = False  # the worker writes its effective.json on its first request

    @property
    def handle(self):
        return None if self.own else self.server

    def start(self) -> None:
        if self.own and self.cfg.watched:
            from workbook.hooks import watch as wmod

            wmod.write_options(self.server.worker_dir,
                               hooks.watch_options(self.cfg, flush_every_steps=1).to_dict())
        if self.own:
            self.server.start()
        else:
            srv.check_compatible(self.server, self.cfg)
        self.timings.update(self.server.timings)
        self.before = srv.traced_req_ids(self.server.frames())
        self.guard_before = self._rank_guard_raw()

    # -- the guard lives in the server's worker(s): each process writes its report per rank
    @property
    def rank_dir(self) -> str | None:
        """The served workers' per-process folders (``<pid>/guard.json`` with every trace
        flush, ``workbook.hooks.plugin``) when the guard runs; else None."""
        return self.server.worker_dir if self.cfg.guard else None

    def effective(self) -> dict:
        return srv.effective(self.server, wait_s=10.0 if self._sent else 0.0)

    def reported(self) -> list:
        self._sent = True
        resp = self.server.chat(self.cfg)
        return [srv.outcome_from_response(resp, self.cfg, self.effective(),
                                          self.server.detokenize)]

    def check(self, name: str) -> list:
        return srv.check_a(self.server, self.cfg)

    def frames(self, n_tokens: int) -> dict:
        mrv2 = self.effective().get("runner_is_v2") is not False
        return srv.await_trace(self.server, self.before, n_tokens,
                               timeout=15.0 if mrv2 else 0.0)

    def watch(self) -> dict | None:
        """The watch's evidence from the served engine's worker (``<pid>/watch.json``)."""
        if not self.cfg.watched:
            return None
        from workbook.hooks import watch as wmod

        data = None
        for _ in range(20):  # the worker writes after every step (flush_every_steps=1)
            data = wmod.read_dir(self.server.worker_dir)
            if data is not None and data.get("state_found") is not False and \
                    data.get("steps", {}).get("real_steps", 0) > 0:
                break
            time.sleep(0.5)
        if data is not None:
            data["startup_observed"] = self.own
        return data

    def stop(self) -> None:
        if self.own:
            self.server.stop()
        self.timings.update(self.server.timings)

    def save_files(self, outdir: str) -> None:
        log = self.server.log_path
        dst = os.path.join(outdir, "server.log")
        if os.path.exists(log) and os.path.abspath(dst) != os.path.abspath(log):
            shutil.copyfile(log, dst)


BACKENDS = {"in-process": InProcess, "server": Served}
