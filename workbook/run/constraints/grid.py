"""The constraints grid as a study of the one pipeline: plan, engines, cells, run folder, command.

The plan (``plan``: every ``RunConfig``, bad input refused before any engine starts) is
``workbook.run.constraints.plan``'s. ``grid_of(plan, out)``: engines through the pipeline's backends
(``mode=server``: one ``vllm serve`` per engine, ``workbook.run.constraints.served``), each batch under
the hooks ``workbook.hooks.install`` installs from its configuration (``row_check``,
``constraint_fault``; over a server the plugin installs the same inside the worker), cells
judged by
``workbook.run.constraints.cases``; with a fault, ``none`` also sends every batch without it — the
reference is the healthy configuration (``grid["reference"]``). ``grid.json`` and
``evidence/<method>/<batch>.json`` are rewritten after every method. ``execute`` / ``command``:
``workbook run constraints`` (= ``python -m workbook.run.constraints.grid`` / ``.constraints``), a fresh run
folder (``workbook.core.rundir``) with its manifest and ``SHA256SUMS``; a stopped grid keeps what
it had. Not here: cases and judging (``run.constraints``), rendering (``report.constraints``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from workbook.core import rundir
from workbook.core.config import ConfigError, RunConfig, installed_vllm_version
from workbook.run.constraints import axes as A
from workbook.run.constraints import cases as C
from workbook.run.constraints.commandline import (EXIT_CODES, Interrupted, Signals,  # noqa: F401
                                                  engine_line, exit_code,
                                                  help_choices)
from workbook.run.verdicts import cell_key, report_lines
from workbook.run.constraints.plan import (ENTRY_KEYS, ENV, REPO, UNUSED, Plan, check_engine_kwargs,  # noqa: F401
                                   config_for, engine_arg_names, entries, find, is_grid, plan)

# ---------------------------------------------------------------- one batch, one engine

def jsonable(x):
    return json.loads(json.dumps(x, default=str))


def send_batch(eng, cfg: RunConfig, cases: dict[str, dict], *, batch: str, zero_head: bool,
               scale: float | None = None, steer_plans: dict | None = None,
               victim: dict | None = None) -> tuple[dict, dict]:
    """``cases`` as one batch on engine ``eng`` under the hooks ``cfg`` asks for (the row
    check on; ``constraint_fault``; ``cfg.arrival``; the drafter steered by ``steer_plans``):
    ``constraints.run_batch``, the one sender (over a server ``gridserve.run_batch``)."""
    from workbook.run.constraints import served as gridserve

    if isinstance(eng, gridserve.ServedEngine):
        head = "zero" if zero_head else "scaled" if scale else "natural"
        return gridserve.run_batch(eng, cfg, cases, batch=batch, head=head, factor=scale,
                                   steer_plans=steer_plans)
    return C.run_batch(eng, cases, zero_head=zero_head, batch=batch, scale=scale, cfg=cfg,
                       steer_plans=steer_plans, victim=victim)


def baselines(eng) -> dict[str, list[int]]:
    """The unconstrained greedy output per lm_head (``natural``, ``zero``, ``scaled``): what
    the cases are derived from (``constraints.case_kwargs``)."""
    from workbook.run.constraints import served as gridserve
    from workbook.run import request as rq

    if isinstance(eng, gridserve.ServedEngine):
        return gridserve.baselines(eng)
    out = {}
    for name, head in (("natural", contextlib.nullcontext()), ("zero", rq.zeroed_lm_head(eng)),
                       ("scaled", rq.scaled_lm_head(eng, C.SCALE))):
        with head:
            out[name] = [int(t) for t in eng.llm.generate(
                [{"prompt_token_ids": C.prompt_for(eng.tokenizer, "nothing")}],
                C.sampling_params({}), use_tqdm=False)[0].outputs[0].token_ids]
    return out


def steer_plans(eng, cfg: RunConfig, cases: dict, batch: str, point: dict | None,
                refs: list | None, spec_only=()) -> dict | None:
    """The drafter's plans for ``cases`` under ``cfg.drafter_steer`` (``axes.steer_plan``):
    ``greedy`` takes method ``none``'s output for the same request at the same point
    (``refs``: the cells so far)."""
    mode = getattr(cfg, "drafter_steer", "none")
    if mode == "none":
        return None
    key = lambda ax: tuple(sorted((k, str(v)) for k, v in (ax or {}).items()
                                  if k not in spec_only))
    ref = {c.constraint: c.output for c in refs or [] if c.method == "none"
           and c.batch == batch and key(c.axes) == key(point)}
    enc = lambda w: eng.tokenizer.encode(w, add_special_tokens=False)
    return {c: A.steer_plan(mode, c, kw, ref.get(c), enc) for c, kw in cases.items()}


def run_batches(eng, cfg: RunConfig, method: str, constraints, batches, baseline: dict,
                point: dict | None = None, refs: list | None = None, spec_only=(),
                on_step=None) -> tuple[list, dict]:
    """Every batch of one method at one grid point on its engine: ``single`` one request per
    constraint, the others one batch of every constraint ``single`` did not see refused.
    Evidence keys: ``constraints.evidence_key(batch, point)``. ``on_step(text)``: each batch
    as it starts (progress)."""
    decode = lambda ids: eng.tokenizer.decode(ids)
    cells: list = []
    evidence: dict = {}
    for batch in batches:
        if on_step:
            on_step(f"batch {batch}")
        zero = batch in ("single", "mixed")
        scale = C.SCALE if batch == "mixed-scaled" else None
        base = baseline["zero" if zero else "scaled" if scale else "natural"]
        cases = {c: C.case_kwargs(c, base, decode) for c in constraints}
        plans = steer_plans(eng, cfg, cases, batch, point, refs, spec_only)
        ek = C.evidence_key(batch, point)
        victim = None
        if cfg.abort != "none":  # axis abort: the aborted neighbour's constraints
            victim = A.victim_kwargs({c: C.case_kwargs(c, base, decode)
                                      for c in A.VICTIM_CASES})
        if batch == "single":
            for c in constraints:
                got, ev = send_batch(eng, cfg, {c: cases[c]}, batch=batch, zero_head=zero,
                                     steer_plans=plans, victim=victim)
                cells += _fill(got, method, point)
                evidence.setdefault(ek, {}).update(ev)
            continue
        refused = {cl.constraint: cl.message for cl in cells if cl.status == "refused"
                   and cl.batch == "single"}
        ok = {c: kw for c, kw in cases.items() if c not in refused}
        size = cfg.mixed_size or len(ok) or 1  # axis cudagraphs: batches of mixed_size
        names = list(ok)
        for i in range(0, max(len(names), 1), size):
            part = {c: ok[c] for c in names[i:i + size]}
            got, ev = send_batch(eng, cfg, part, batch=batch, zero_head=zero, scale=scale,
                                 steer_plans=plans, victim=victim)
            cells += _fill(got, method, point)
            evidence.setdefault(ek, {}).update(ev)
        cells += [C.Cell(c, method, batch, "refused", refused[c], axes=dict(point or {}))
                  for c in cases if c in refused]
    return cells, evidence


def _fill(cells: dict, method: str, point: dict | None = None) -> list:
    for c in cells.values():
        c.method = method
        c.axes = dict(point or {})
    return list(cells.values())


@dataclass
class Engine:
    """One method's engine, started through the pipeline's backend (no hooks of its own)."""

    cfg: RunConfig
    log_dir: str | None = None
    backend: object = None
    timings: dict = field(default_factory=dict)

    def __enter__(self):
        from workbook.run.backends import BACKENDS

        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        if self.cfg.mode == "server":  # the row check goes in through the plugin
            from workbook.run.constraints import served as gridserve

            self.backend = gridserve.ServedEngine(self.cfg, self.log_dir)
            try:
                return self.backend.start()
            except Exception as e:
                raise RuntimeError(C.one_line(e)) from e
        quiet = self.cfg.replace(row_check=False, constraint_fault="none", fault="none",
                                 guard=False, trace=False)
        self.backend = BACKENDS[quiet.mode](quiet, outdir=self.log_dir)
        try:
            self.backend.start()
        except Exception as e:
            if C.is_refusal(e):
                raise C.MethodRefused(C.one_line(e)) from e
            raise
        return self.backend.engine

    def __exit__(self, *exc):
        from workbook.run.constraints import invariance
        from workbook.vllm import engine as vengine

        invariance.release()  # the fresh-slot reference engines of this configuration
        self.backend.stop()
        if self.cfg.mode == "server":
            return False
        vengine.release(self.backend.cfg)
        gc.collect()
        return False


# ---------------------------------------------------------------- the grid

def _version() -> str:
    v = getattr(sys.modules.get("vllm"), "__version__", None)
    return str(v) if v else ".".join(map(str, installed_vllm_version() or ()))


def engine_groups(p: Plan, method: str) -> tuple[list[list[dict]], list[tuple[dict, str]]]:
    """The points ``method`` runs, grouped by engine (one group per distinct engine
    configuration: ``workbook.vllm.engine.engine_key``, the CPU async shim included), in the
    order of ``p.points``; and the points not available on this branch (with why)."""
    from workbook.vllm import engine as vengine

    groups: dict[str, list[dict]] = {}
    missing = []
    for pt in p.points:
        if not A.runs_for(method, p.axes, pt):
            continue
        why = A.unavailable(p.axes, pt)
        if why:
            missing.append((pt, why))
            continue
        cfg = p.config(method, pt)
        groups.setdefault(vengine.engine_key(cfg, cfg.async_on_cpu), []).append(pt)
    return list(groups.values()), missing


def benchmark(grid: dict) -> dict:
    """Engine starts, cells per start and wall time of a grid (``grid.json``'s ``engines``)."""
    rows = grid.get("engines") or []
    started = [r for r in rows if r.get("status") == "ok"]
    ran = sum(r.get("cells", 0) for r in started)
    return {"engine_starts": len(started), "engines_refused": len(rows) - len(started),
            "cells": len(grid.get("cells") or []), "cells_run": ran,
            "cells_per_start": round(ran / len(started), 1) if started else 0.0,
            "start_seconds": round(sum(r.get("start_s", 0.0) for r in started), 1),
            "wall_seconds": grid.get("seconds")}


def grid_of(p: Plan, out: str | None = None, *, on_method=None, progress=None) -> dict:
    """Run plan ``p``; ``grid.json`` and ``evidence/`` under ``out`` after every engine.
    One engine per method and engine configuration serves every point that shares it
    (``engine_groups``). ``on_method(row)``: each engine's row (method, points, status,
    start and total seconds, cells, message) as it ends. ``progress``
    (``workbook.core.progress.Progress`` over the engines): each engine's steps (start,
    point, batch) and one line as it ends."""
    from workbook.vllm import async_shim

    def step(text):
        if progress is not None:
            progress.step(text)

    cells: list = []
    ref_cells: list = []
    evidence: dict = {}
    engines: list = []
    baseline = None
    t0 = time.time()
    from workbook.run.constraints import invariance

    invariance.reset_cost()
    inv_cost = invariance.COST  # accumulates as batches run (the grid prints it)

    def assemble(status: str) -> dict:
        ref = ref_cells if p.fault else None
        C.differential(cells, evidence, reference=ref, spec_only=p.spec_only)
        A.invariance(cells, p.axes, lambda c, i: C.emitted_at(evidence.get(c.method, {}).get(
            C.evidence_key(c.batch, c.axes), {}).get(c.constraint, {}), i))
        grid = {"vllm_version": _version(), "methods": p.methods, "batches": p.batches,
                "constraints": p.constraints, "fault": p.fault, "run": p.name,
                "config": p.base.to_dict(), "status": status,
                "axes": {n: list(a.values) for n, a in p.axes.items()
                         if any(n in pt for pt in p.points)},
                "axis_defaults": {n: a.default for n, a in p.axes.items()},
                "points": p.points, "engines": engines,
                "seconds": round(time.time() - t0, 1), "cells": [c.to_dict() for c in cells]}
        grid["benchmark"] = benchmark(grid)
        grid["batch_invariance"] = {k: round(v, 1) if isinstance(v, float) else v
                              for k, v in inv_cost.items()}
        if p.fault:
            grid["reference"] = {"method": "none", "fault": None,
                                 "cells": [c.to_dict() for c in ref_cells]}
        if out:
            os.makedirs(out, exist_ok=True)
            rundir.write_json(os.path.join(out, "grid.json"), grid)
            for m, ev in evidence.items():
                os.makedirs(os.path.join(out, "evidence", m), exist_ok=True)
                for b, e in ev.items():
                    rundir.write_json(os.path.join(out, "evidence", m, f"{b}.json"), jsonable(e))
        return grid

    def blank(m, pts, st, msg):
        return [C.Cell(c, m, b, st, msg, axes=dict(pt)) for pt in pts for c in p.constraints
                for b in p.batches]

    try:
        for m in p.methods:
            groups, missing = engine_groups(p, m)
            for pt, why in missing:
                cells += blank(m, [pt], "not available", why)
            refused_method = None
            for gi, pts in enumerate(groups):
                cfg0 = p.config(m, pts[0])
                t1 = time.time()
                row = {"method": m, "points": [A.label(x) for x in pts], "status": "ok"}
                if refused_method is not None:  # vLLM refused the method itself: not again
                    cells += blank(m, pts, "method refused", refused_method)
                    engines.append({**row, "status": "method refused", "seconds": 0.0,
                                    "message": refused_method, "cells": 0})
                    continue
                suffix = "" if not pts[0] else "@" + A.label(pts[0]).replace(", ", ",")
                log = os.path.join(out, "logs", m + suffix.replace("/", "_")) if out else None
                done: list = []
                n0 = len(cells)
                step(f"{m}: starting the engine"
                     + (f" ({len(pts)} point(s) share it)" if pts[0] else ""))
                try:
                    with Engine(cfg0, log) as eng:
                        row["start_s"] = round(time.time() - t1, 1)
                        facts = {"async": async_shim.effective(eng.llm)
                                 if hasattr(eng, "llm") else None,
                                 "preemption_counter": getattr(
                                     eng, "PREEMPTION_COUNTER", "Request.num_preemptions")}
                        row["async_scheduling"] = facts["async"]
                        if baseline is None:
                            step(f"{m}: the unconstrained baselines")
                            baseline = baselines(eng)
                        for i, pt in enumerate(pts):
                            cfg = p.config(m, pt)
                            at = (f" @ {A.label(pt)} (point {i + 1}/{len(pts)})" if pt
                                  else "")
                            got, ev = run_batches(eng, cfg, m, p.constraints, p.batches,
                                                  baseline, point=pt, refs=cells,
                                                  spec_only=p.spec_only,
                                                  on_step=lambda b: step(f"{m}{at}: {b}"))
                            A.verify(got, p.axes, pt, facts)
                            if m == "none" and p.fault:  # the healthy configuration
                                ref, rev = run_batches(
                                    eng, cfg.replace(constraint_fault="none", fault="none"),
                                    m, p.constraints, p.batches, baseline, point=pt)
                                ref_cells += ref
                                evidence.setdefault("reference", {}).update(rev)
                            cells += got
                            evidence.setdefault(m, {}).update(ev)
                            done.append(pt)
                except Exception as e:  # this engine cannot start here: vLLM's message
                    rest = [pt for pt in pts if pt not in done]
                    if isinstance(e, C.MethodRefused):
                        msg = str(e)
                        st = "method refused" if gi == 0 else "refused"
                        if gi == 0:
                            refused_method = msg
                    else:
                        st, msg = "error", C.one_line(e)
                    cells += blank(m, rest, st, msg)
                    row.update(status=st, message=msg)
                row["cells"] = len(cells) - n0
                row["seconds"] = round(time.time() - t1, 1)
                engines.append(row)
                assemble("running")
                if on_method:
                    on_method(row)
                if progress is not None:
                    progress.done(engine_line(row, cells[n0:]))
    except BaseException:  # a signal, Ctrl-C: the grid keeps what it had
        assemble("stopped")
        raise
    return assemble("complete")


def n_engines(p: Plan) -> int:
    """Engine starts the plan asks for (one per method and engine configuration)."""
    return sum(len(engine_groups(p, m)[0]) for m in p.methods)


def run(methods=C.METHODS, constraints=C.CONSTRAINTS, *, out: str | None = None,
        batches=C.BATCHES, fault: str | None = None, k: int | None = None,
        overrides: dict | None = None) -> dict:
    """The grid of ``methods`` x ``constraints`` x ``batches`` on the environment's defaults
    (+ ``overrides``, ``k``, ``fault``), written into ``out`` itself (a notebook's folder)."""
    over = dict(overrides or {})
    if k is not None:
        over["num_spec_tokens"] = k
    if fault:
        over["constraint_fault"] = fault
    return grid_of(plan(ENV, over, methods=methods, constraints=constraints, batches=batches),
                   out)


def execute(p: Plan, out: str = "outputs", *, report=None, progress=None,
            last: bool = False) -> tuple[str, dict]:
    """Plan ``p`` into a fresh run folder under ``out``; returns (folder, manifest).
    ``report(run_dirs, path)`` (the layer above passes ``workbook.report.write``) writes
    ``report.html`` before ``SHA256SUMS``; ``progress``: ``grid_of``'s. SIGINT and SIGTERM
    stop it (status ``interrupted``) even where a library turned the exception into an error of
    its own (pydantic's schema build does): the handler records every signal. ``last``: the
    command ends with this grid — once a signal closed the folder, later ones are ignored
    (``rundir.ignore_late_signals``) instead of the previous handlers coming back."""
    run_id, run_dir = rundir.new_run_dir(os.path.abspath(out), p.hardware)
    rel = os.path.relpath(p.env_path, REPO)
    manifest = {"study": "constraints", "environment": os.path.splitext(
        os.path.basename(p.env_path))[0], "environment_file": p.env_path if rel.startswith("..")
        else rel, "environment_sha256": rundir.file_sha256(p.env_path), "hardware": p.hardware,
        "run_id": run_id, "run": p.name, "started": rundir.now(), "finished": None,
        "status": "running", "argv": sys.argv, "methods": p.methods,
        "constraints": p.constraints, "batches": p.batches, "constraint_fault": p.fault,
        "config": p.base.to_dict(), "engines": [], "runs": []}
    path = os.path.join(run_dir, rundir.MANIFEST)
    rundir.write_json(path, manifest)

    sig = Signals(last)

    def on_method(row):
        manifest["engines"].append(row)
        rundir.write_json(path, manifest)
        sig.check()  # an engine turned the signal into its own error: stop all the same

    def interrupted(name: str) -> None:
        done = {r["method"] for r in manifest["engines"]}
        manifest.update(status="interrupted", interrupted={
            "signal": name, "method": next((m for m in p.methods if m not in done), None),
            "at": rundir.now()})

    with sig:
        try:
            grid = grid_of(p, run_dir, on_method=on_method, progress=progress)
            sig.check()
            manifest["status"] = "ok"
            manifest["counts"] = dict(Counter(c["status"] for c in grid["cells"]))
        except (KeyboardInterrupt, Interrupted) as e:
            sig.closing()
            interrupted(e.args[0] if isinstance(e, Interrupted) else "SIGINT")
        except Exception as e:
            sig.closing()
            if sig.received:  # the signal surfaced as another error: still an interruption
                interrupted(sig.name)
            else:
                manifest.update(status="failed", failure={"ename": type(e).__name__,
                                                          "evalue": str(e)[:2000]})
        finally:
            sig.closing()
            manifest["finished"] = rundir.now()
            rundir.write_json(path, manifest)
    if report is not None and manifest["status"] != "interrupted":
        try:
            report([run_dir], os.path.join(run_dir, rundir.REPORT))
        except Exception as e:  # the checksums come first
            print(f"workbook: the report failed: {type(e).__name__}: {e}", file=sys.stderr)
    rundir.write_sums(run_dir)
    return run_dir, manifest


def summary_lines(grid: dict, run_dir: str | None = None) -> list[str]:
    """The grid's counts, then one line per violated / failed cell (with ``run_dir``: under a
    violation, the commands for its plain-vLLM reproducer and its upstream report)."""
    cells = grid.get("cells", [])
    counts = Counter(c["status"] for c in cells)
    if not cells:
        return ["no cell finished (grid.json is rewritten as each method ends)"]
    lines = [f"{len(cells)} cells: " + ", ".join(f"{n} {st}" for st, n in sorted(counts.items()))
             + (f" (fault {grid['fault']}; reference: none without it)"
                if grid.get("fault") else "")]
    b = grid.get("benchmark")
    if b:
        lines.append(f"engine starts {b['engine_starts']} ({b['start_seconds']} s starting), "
                     f"{b['cells_per_start']} cells per start, wall time {b['wall_seconds']} s"
                     + (f"; {b['engines_refused']} engine(s) refused by vLLM"
                        if b["engines_refused"] else ""))
    unreached = sum(1 for c in cells if c.get("unreached"))
    if unreached:
        lines.append(f"{unreached} cell(s) did not reach their axis value (e.g. no preemption "
                     "happened): see each cell's 'unreached'")
    inv = grid.get("batch_invariance")
    if inv and inv.get("runs"):
        lines.append(f"batch-invariance reference: {inv['runs']} re-run(s) alone on fresh "
                     f"slots for {inv['batches']} batch(es), {inv['seconds']} s, "
                     f"{inv['engine_starts']} engine start(s) ({inv['start_seconds']} s)")
    victims = [c for c in cells if c.get("victim")]
    if victims:
        lines.append(f"{len(victims)} victim(s): their own contract held, their rows or output "
                     "changed (listed as violated below, with the cause)")
    for c in cells:
        if c["status"] in ("violated", "error", "method refused"):
            first = c.get("first") or {}
            where = (f" at step {first.get('step')} row {first.get('row')} "
                     f"({first.get('stage')}): {first.get('what')}" if first
                     else f": {c.get('message')}")
            at = f" [{A.label(c['axes'])}]" if c.get("axes") else ""
            st = "violated (victim)" if c.get("victim") else c["status"]
            lines.append(f"  {st}: {c['constraint']} / {c['method']} / "
                         f"{c['batch']}{at}{where}")
            if run_dir and c["status"] == "violated":
                lines += report_lines(run_dir, cell_key(c))
    return lines


def command(env: str = ENV, overrides: dict | None = None, *, only=None, methods=None,
            constraints=None, batches=None, out: str = "outputs", report=None, axes=None,
            vary=None, progress: bool | None = None) -> int:
    """``workbook run constraints``: plan (bad input: ``ConfigError``, nothing started), run
    (the engines' progress: ``workbook.core.progress``, a line per engine as it ends), print
    the counts, the violations, the report and — last — the run folder. Exit codes:
    ``EXIT_CODES``."""
    from workbook.core import progress as wprogress

    p = plan(env, overrides, only=only, methods=methods, constraints=constraints,
             batches=batches, axes=axes, vary=vary)
    entry = "" if p.name == "grid" else f" {p.name}"
    print(f"constraints grid{entry}: methods {', '.join(p.methods)}; "
          f"{len(p.constraints)} constraint(s); batches {', '.join(p.batches)}"
          + (f"; {len(p.points)} axis point(s): " + " | ".join(A.label(x) for x in p.points)
             if p.points != [{}] else "")
          + (f"; constraint fault {p.fault}" if p.fault else ""), flush=True)
    with wprogress.Progress(n_engines(p), "constraints grid", wprogress.enabled(progress),
                            unit="engine") as bar:
        run_dir, manifest = execute(p, out, report=report, progress=bar, last=True)
    grid = rundir.read_json(os.path.join(run_dir, "grid.json"), {}) or {}
    print("\n".join(summary_lines(grid, run_dir)))
    if os.path.exists(os.path.join(run_dir, rundir.REPORT)):
        print(f"report: {os.path.join(run_dir, rundir.REPORT)}")
    st = manifest["status"]
    if st == "interrupted":  # late signals are ignored by now (execute's last=True)
        sig = manifest["interrupted"]["signal"]
        print(f"workbook: interrupted by {sig}; the run folder keeps what it had (manifest, "
              f"grid.json, SHA256SUMS): {run_dir}", file=sys.stderr)
        print(run_dir)
        return 128 + int(getattr(signal, sig, signal.SIGINT))
    if st == "failed":
        f = manifest["failure"]
        print(f"workbook: the grid failed: {f['ename']}: {f['evalue'][:300]}", file=sys.stderr)
    print(run_dir)
    return exit_code(st, grid.get("cells") or [])


def add_arguments(ap) -> None:
    """The grid's own options (``workbook run constraints`` and ``python -m``), each with its
    choices (``help_choices``)."""
    ch = help_choices()
    ap.add_argument("--methods", nargs="+", metavar="METHOD",
                    help=f"constraints grid: the methods ({', '.join(C.METHODS)}; none always "
                         "runs: the reference)")
    ap.add_argument("--constraints", nargs="+", metavar="NAME",
                    help="constraints grid: the constraints (default: the entry's, else all: "
                         f"{', '.join(C.CONSTRAINTS)})")
    ap.add_argument("--batches", nargs="+", metavar="BATCH",
                    help=f"constraints grid: the batches ({', '.join(C.BATCHES)})")
    ap.add_argument("--axis", dest="axes", action="append", metavar="NAME[=V1,V2]",
                    help="constraints grid: an axis of the environment's 'axes' (all its "
                         "values, or those named); repeat for several. Axes and values "
                         f"(default first): {ch['axes']}")
    ap.add_argument("--vary", choices=A.VARY,
                    help="constraints grid: the axes' product (default) or one at a time")


def main(argv=None) -> int:
    import argparse

    import yaml

    def pair(text):
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
        return key.strip(), yaml.safe_load(value)

    from workbook.core import progress as wprogress

    ap = argparse.ArgumentParser(prog="python -m workbook.run.constraints.grid",
                                 description="the constraints grid (= workbook run constraints)",
                                 epilog=EXIT_CODES)
    ap.add_argument("env", nargs="?", default=ENV)
    ch = help_choices()
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help=f"the environment's entry ({ch['entries']})")
    ap.add_argument("--set", dest="overrides", action="append", type=pair, default=[],
                    metavar="KEY=VALUE", help="a RunConfig field (YAML), e.g. mode=MODE "
                                              f"({ch['modes']})")
    ap.add_argument("--fault", help="constraint_fault (= --set constraint_fault=NAME): "
                                    f"{ch['faults']}")
    ap.add_argument("-k", type=int, help="num_spec_tokens (= --set num_spec_tokens=K)")
    ap.add_argument("--out", default="outputs", help="output root (default: outputs)")
    add_arguments(ap)
    wprogress.add_arguments(ap)
    a = ap.parse_args(argv)
    over = dict(a.overrides)
    over.update({k: v for k, v in (("constraint_fault", a.fault), ("num_spec_tokens", a.k))
                 if v is not None})
    try:
        return command(a.env, over, only=a.only, methods=a.methods, constraints=a.constraints,
                       batches=a.batches, out=a.out, axes=a.axes, vary=a.vary,
                       progress=a.progress)
    except ConfigError as e:
        print(f"workbook: configuration error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
