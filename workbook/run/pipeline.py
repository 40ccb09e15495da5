"""One investigation run: a backend + hooks + the reported request → evidence files in a folder.

``run(cfg, outdir, checks=..., backend=...)`` is what every notebook, the batch executors and
the server path call; ``Run`` is its step-wise form for notebooks that explore. The steps, in
order (each named, timed, and writing its evidence file as soon as it exists, so a run that
dies half-way still leaves what it had):

1. ``validate``  ``cfg`` and the checks (``ConfigError`` before any engine starts);
   ``config.json``
2. ``start``     the backend chosen from ``BACKENDS`` by ``cfg.mode`` (``workbook.run.backends``:
   an in-process engine with the hooks installed, or ``vllm serve`` with the hooks installed by
   the plugin); ``effective.json`` — the configuration the engine really runs
3. ``request``   the reported request; ``outcome.json`` (an error there is recorded, then raised)
4. ``checks``    the deterministic checks asked for (A, B); ``checks.json``
5. ``trace``     the per-step trace of this run's requests; ``trace/*.parquet`` (with the guard
   on, in-process: ``trace/guard.parquet``, one row per field of the guard's device state it
   repaired — ``workbook.core.tracefiles.GUARD_COLUMNS``)
6. ``watch``     with ``cfg.watch`` / ``cfg.localize``: the start-up watch's evidence
   (``workbook.hooks.watch``); ``watch.json`` (+ ``watch/`` as it was written during start-up)
7. ``diagnose``  the study's verdict (the study chosen by name from ``STUDIES``: the budget's
   ``workbook.run.budget`` — first violation, causes and hypothesis), and
   the watch's reading of the state's integrity (``workbook.run.integrity``); with the guard on,
   ``verdict["guard"]`` (``guard_section``: tokens it replaced, fields of its own state it
   repaired); ``verdict.json``
8. ``probes``    only with ``cfg.probes`` and a violated verdict: the checks that separate the
   remaining causes, each a re-run of the violating request with one switch on the in-process
   engine (the study's ``probes``); ``probes.json``, and ``verdict.json`` re-saved with the
   results fed back (the study's ``with_probes``)
8. ``finish``    hooks removed / server stopped; ``timings.json`` and the backend's own files

Adding an evidence file is one edit: a step here that calls ``self.save(name, obj)``.
``on_stage(name, elapsed_s)`` is called as each step starts (progress displays), and with an
``outdir`` the step is written to ``stage.json`` there (a batch polls it across processes).

Not here: papermill and batches (``workbook.batch``), reports (``workbook.report``), any study's
own rules: the pipeline is the spine of ``workbook.run`` and imports no study; the diagnosis
and probe steps call the study named in ``STUDIES`` (as papermill picks an engine by name).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from workbook.core import rundir, tracefiles
from workbook.core.config import (CHECK_NAMES, ConfigError, RunConfig,  # noqa: F401
                                  check_checks, validate)

STAGE_FILE = "stage.json"  # the step now running, rewritten as each starts (batch progress)
# the studies whose diagnosis and probes the pipeline's last steps run: name -> module with
# ``verdict(frames, effective, outcomes, cfg)``, ``with_probes``, ``probe_plan``, ``run_probes``,
# ``PROBES`` (the budget investigation is the one study that walks these steps today)
STUDIES = {"budget": "workbook.run.budget"}


def study(name: str = "budget"):
    """The study module registered under ``name`` (``STUDIES``)."""
    import importlib

    return importlib.import_module(STUDIES[name])


@dataclass
class Result:
    cfg: RunConfig
    outdir: str | None
    effective: dict[str, Any] = field(default_factory=dict)
    outcomes: list = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, Any] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    watch: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    engine: Any = None  # the in-process Engine, or the Server (kept for a notebook to explore)

    @property
    def outcome(self):
        return self.outcomes[0] if self.outcomes else None


class Run:
    """The pipeline, step by step: ``with Run(cfg, outdir) as r: r.request(); ...``."""

    def __init__(self, cfg: RunConfig, outdir: str | None = None, *, checks=(), backend=None,
                 on_stage: Callable[[str, float], None] | None = None):
        from workbook.vllm import env

        self._t0 = time.perf_counter()
        self.on_stage = on_stage
        self._outdir = outdir
        self._stage("validate")
        self.cfg = validate(cfg, on_cpu=env.on_cpu())
        self.check_names = check_checks(self.cfg, checks)
        self.result = Result(cfg=self.cfg, outdir=outdir)
        if outdir:
            os.makedirs(outdir, exist_ok=True)
        self.save("config", self.cfg.to_dict())
        if backend is None:
            from workbook.run.backends import BACKENDS

            backend = BACKENDS[self.cfg.mode](self.cfg, outdir=outdir)
        self.backend = backend
        self.started = False

    # -- plumbing
    def _stage(self, name: str) -> None:
        if self._outdir and os.path.isdir(self._outdir):
            rundir.write_json(os.path.join(self._outdir, STAGE_FILE), {
                "stage": name, "elapsed_s": round(time.perf_counter() - self._t0, 2)})
        if self.on_stage is not None:
            self.on_stage(name, time.perf_counter() - self._t0)

    def save(self, name: str, obj) -> None:
        """Write evidence file ``<name>.json`` (no-op without an outdir)."""
        if self.result.outdir:
            rundir.write_json(os.path.join(self.result.outdir, f"{name}.json"), obj)

    def _timed(self, name: str, fn):
        self._stage(name)
        t = time.perf_counter()
        try:
            return fn()
        finally:
            self.result.timings[f"{name}_s"] = time.perf_counter() - t

    # -- steps
    def start(self) -> "Run":
        res = self.result
        self._timed("start", self.backend.start)
        self.started = True
        res.timings.update(self.backend.timings)
        res.engine = self.backend.handle
        res.effective = self.backend.effective()
        self.save("effective", res.effective)
        return self

    def request(self) -> list:
        res = self.result
        try:
            res.outcomes = self._timed("request", self.backend.reported)
        except Exception as e:
            err = {"type": type(e).__name__, "message": str(e)[:2000],
                   **getattr(e, "details", {})}
            res.effective = self.backend.effective()
            self.save("effective", res.effective)
            self.save("outcome", {"error": err})
            res.verdict = {"verdict": "inconclusive", "hypothesis": None, "error": err,
                           "summary": f"the request failed: {type(e).__name__}: {e}"[:500]}
            self.save("verdict", res.verdict)
            raise
        res.timings["generate_s"] = res.timings["request_s"]
        self.save("outcome", [o.to_dict() for o in res.outcomes])
        res.effective = self.backend.effective()  # a server's worker writes its facts now
        self.save("effective", res.effective)
        return res.outcomes

    def checks(self, names=None) -> dict:
        res = self.result
        for name in check_checks(self.cfg, names if names is not None else self.check_names):
            res.checks[name] = [o.to_dict() for o in self._timed(f"check_{name}",
                                                                 lambda: self.backend.check(name))]
            self.save("checks", res.checks)
        return res.checks

    def trace(self) -> dict:
        res = self.result
        if not self.cfg.trace:
            return res.frames
        n = sum(o.completion_tokens for o in res.outcomes)
        res.frames = self._timed("trace", lambda: self.backend.frames(n))
        runner = self._guard_runner()
        if res.frames and runner is not None:
            from workbook.hooks import guard

            res.frames["guard"] = guard.repairs_table(runner)
        elif res.frames and self.cfg.guard and hasattr(self.backend, "rank_guards") \
                and getattr(self.backend, "rank_dir", None):
            from workbook.core import ranks  # several ranks: every rank's repairs, rank-tagged

            res.frames["guard"] = ranks.guard_table(self.backend.rank_guards())
        if res.outdir and res.frames:
            self._timed("trace_save", lambda: tracefiles.save(
                res.frames, os.path.join(res.outdir, "trace")))
        return res.frames

    def watch(self) -> dict | None:
        res = self.result
        if not self.cfg.watched or not hasattr(self.backend, "watch"):
            return res.watch
        res.watch = self._timed("watch", self.backend.watch)
        if res.watch is not None:
            self.save("watch", res.watch)
        return res.watch

    def diagnose(self) -> dict:
        from workbook.run import integrity

        res = self.result
        res.verdict = self._timed("diagnose", lambda: study().verdict(
            res.frames, res.effective, res.outcomes, self.cfg))
        if res.watch is not None:
            res.verdict["integrity"] = integrity.verdict_from_watches(res.watch)
        if self.cfg.guard:
            res.verdict["guard"] = self.guard_section()
        if getattr(self.backend, "agreement", None) is not None:  # several ranks (docs/parallel.md)
            from workbook.core import ranks

            res.verdict["ranks"] = self.backend.agreement
            odd = ranks.disagreement(self.backend.agreement)
            if odd:
                res.verdict["ranks"]["sentence"] = odd
                res.verdict["summary"] = f"{res.verdict.get('summary', '')}; but {odd}"
        self.save("verdict", res.verdict)
        return res.verdict

    # -- the guard's evidence (the guard lives on the in-process runner)
    GUARD_RECORDS = 200  # repairs listed in the verdict; the trace's guard table has them all

    def _guard_runner(self):
        if not self.cfg.guard or getattr(self.backend, "rank_dir", None):
            return None  # several ranks: the guard lives in vLLM's workers (rank_guards)
        eng = getattr(self.backend, "engine", None)
        return getattr(eng, "runner", None) if self.cfg.mode == "in-process" else None

    def guard_section(self) -> dict:
        """``verdict["guard"]``: ``workbook.hooks.guard.report`` of this run's runner —
        ``installed``, ``enabled``, ``guarded_steps``, ``fixed_tokens``, ``repaired_fields``,
        ``repaired_requests``, ``repairs`` (the first ``GUARD_RECORDS`` records),
        ``repairs_dropped``, ``truth_lagged_rows`` — plus ``available``; a server run's guard
        lives in the server's worker (``available: False`` and ``why``)."""
        runner = self._guard_runner()
        if runner is None and getattr(self.backend, "rank_dir", None):
            from workbook.core import ranks  # several ranks: each worker wrote its report

            return ranks.guard_section(self.backend.rank_guards())
        if runner is None:
            return {"installed": True, "available": False,
                    "why": f"mode={self.cfg.mode!r}: the guard runs in the server's worker "
                           "process; its repairs are logged there (vllm.workbook.guard)"}
        from workbook.hooks import guard

        return {"available": True, **guard.report(runner, max_records=self.GUARD_RECORDS)}

    def probes(self) -> dict:
        """Confirm the cause: run the probes the verdict calls for and feed them back."""
        res = self.result
        if not self.cfg.probes or res.verdict.get("verdict") != "violated":
            return res.probes
        st = study()
        eng = getattr(self.backend, "engine", None)
        if self.cfg.mode != "in-process" or eng is None:
            res.probes = {name: {"switch": st.PROBES[name].switch, "ran": False,
                                 "why": "probes re-send the request on the in-process engine; "
                                        f"this run is mode={self.cfg.mode!r}"}
                          for name in st.probe_plan(res.verdict, self.cfg)}
        else:
            res.probes = self._timed("probes", lambda: st.run_probes(eng, self.cfg, res.verdict))
        self.save("probes", res.probes)
        res.verdict = st.with_probes(res.verdict, res.probes)
        self.save("verdict", res.verdict)
        return res.probes

    def finish(self) -> Result:
        res = self.result
        self._stage("finish")
        try:
            if self.started:
                t = time.perf_counter()
                self.backend.stop()
                res.timings["stop_s"] = time.perf_counter() - t
        finally:
            res.timings.update(self.backend.timings)
            # the pipeline's own time: vLLM's import and the engine start happen inside it
            # (engine.start), so import_s is part of it, not added on top
            res.timings["total_s"] = time.perf_counter() - self._t0
            self.save("timings", res.timings)
            if res.outdir:
                self.backend.save_files(res.outdir)
        return res

    def __enter__(self) -> "Run":
        try:
            return self.start()
        except BaseException:
            self.finish()
            raise

    def __exit__(self, *exc) -> bool:
        self.finish()
        return False


def run(cfg: RunConfig, outdir: str | None = None, *, checks=(), backend=None,
        on_stage=None) -> Result:
    """Run one configuration end to end; write the evidence into ``outdir`` if given."""
    with Run(cfg, outdir, checks=checks, backend=backend, on_stage=on_stage) as r:
        r.request()
        r.checks()
        r.trace()
        r.watch()
        r.diagnose()
        r.probes()
    return r.result


def load(outdir: str) -> dict[str, Any]:
    """Everything a run folder holds (``workbook.core.rundir.load_run``)."""
    return rundir.load_run(outdir)
