#!/usr/bin/env python3
"""What each hook costs per engine step, side by side in ONE engine run: ratios, not timings.

One engine; the same request batch (the reported request, ``--batch`` copies with thinking
budget ``--budget`` — ``ignore_eos``, so every request runs ``--max-tokens`` tokens and the budget
state is live every step) is generated once per arm and round, the arms interleaved
(``--rounds``) so drift hits all of them. Arms: ``none`` (vLLM alone), ``trace``
(``workbook.hooks.observe.tracer``; its deferred host copies are timed separately), ``guard``
(``workbook.hooks.guard``), ``constraints`` (the row check of every per-request sampling
constraint, ``workbook.hooks.observe.rowcheck``; its deferred host copies are timed separately too),
``trace+constraints`` (both collectors on one ``workbook.hooks.observe.observer``, as
``workbook.hooks.install`` puts them for a run that asks for both; the step's outputs recorded
once for both by ``workbook.hooks.observe.outputs``), ``watch`` (the start-up
watch's per-step ring check after start-up:
the engine is then started with the watch in place, ``--watch``, and every other arm runs with
it suspended; also the watch's own time per step, from its counters), ``trace+guard``. Prints
one line per arm — median ms per step and its ratio to ``none`` — and one JSON line.

Also per arm, from one extra generate each (outside the timed rounds):
- ``--sync-check`` (CUDA): host<->device synchronizations per step, all and those raised from the
  workbook's own code (``torch.cuda.set_sync_debug_mode``): a hook that synchronizes stalls the
  whole step, whatever its own cost;
- ``--count-ops``: aten operators dispatched per step (a ``TorchDispatchMode``; eager engines):
  what a hook adds in launches, the same number on any device; with it, per step, the operators
  issued from workbook code, and those that build a tensor from host data or read a device value
  (``lift_fresh`` / ``_local_scalar_dense``): a synchronization on a GPU, seen at the
  dispatcher, so also on the CPU.

    python benchmarks/step_overhead.py --watch --count-ops              # CPU, tiny dense MTP
    python benchmarks/step_overhead.py --arms none,trace,constraints --count-ops  # row check vs tracer
    python benchmarks/step_overhead.py --env h200 --run r27-mtp-cudagraphs --sync-check  # GPU

Absolute times mean something only on the GPU; on the CPU (Triton interpreter) read the ratios
and the operator counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings


def arms(names, watch_on: bool):
    from workbook.hooks import guard
    from workbook.hooks.observe.rowcheck import RowCheck
    from workbook.hooks.observe.tracer import Tracer

    def trace():
        return Tracer()

    def both():
        stack = contextlib.ExitStack()
        stack.enter_context(guard.enabled())
        stack.enter_context(Tracer())
        return stack

    def trace_rows():  # the budget evidence and the row check together: one observer
        from workbook.hooks.observe.observer import Observer

        return Observer([RowCheck(), Tracer()])

    table = {"none": contextlib.nullcontext, "trace": trace, "guard": guard.enabled,
             "trace+guard": both, "constraints": RowCheck, "trace+constraints": trace_rows}
    if watch_on:
        table["watch"] = contextlib.nullcontext  # the watch is resumed around it (main)
    return {n: table[n] for n in names if n in table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cfg", default="{}", help="RunConfig fields (JSON)")
    ap.add_argument("--env", help="take the engine configuration from environments/ENV.yaml's")
    ap.add_argument("--run", help="... named RUN (with --env)")
    ap.add_argument("--matrix", nargs="*", default=[],
                    help="afterwards, run these runs of --env in-process on the same engine")
    ap.add_argument("--out", default="outputs", help="output root for --matrix")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--budget", type=int, default=1, help="thinking budget of every request "
                    "(-1: none, the budget state idle)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arms", default="none,trace,guard,watch,trace+guard,constraints")
    ap.add_argument("--watch", action="store_true", help="start the engine with the start-up "
                    "watch (localization off) so the watch arm runs")
    ap.add_argument("--sync-check", action="store_true", help="count synchronizations per step")
    ap.add_argument("--count-ops", action="store_true", help="count aten operators per step")
    ap.add_argument("--json-out")
    a = ap.parse_args()

    from workbook.core.config import RunConfig
    from workbook.run import request
    from workbook.vllm import engine

    if a.env:
        from workbook import batch

        env = batch.load_environment(a.env, notebooks=False)
        (spec,) = batch.select(env, [a.run])
        cfg = RunConfig.from_params(spec.params).replace(fault="none", guard=False)
    else:
        cfg = RunConfig(**{"spec_method": "mtp", "num_spec_tokens": 4, "max_num_seqs": 8,
                           **json.loads(a.cfg)})
    w = None
    if a.watch:
        from workbook.hooks import watch
        from workbook.run import backends

        own, _ = backends.own_engine(cfg.replace(watch=True, localize="none", trace=False))
        eng, w = own.engine, own.watch
        watch.suspend()  # every arm but "watch" runs without it
    else:
        eng = engine.shared(cfg)  # --matrix runs with the same engine arguments reuse it
    use = arms(a.arms.split(","), w is not None)
    budget = None if a.budget < 0 else a.budget
    own_s: list[float] = []  # the watch's own seconds per step (its counters), per watched run

    def generate():
        request.run_reported(eng, budget=budget, n=a.batch, max_tokens=a.max_tokens)

    def once(name, around=contextlib.nullcontext):
        ctx = use[name]()
        counter = _StepCounter()
        if name == "watch":
            watch.resume()
            own0 = w.check_s["steps"]
        try:
            with around():
                t0 = time.perf_counter()
                with counter, ctx:
                    generate()
                _sync()
                dt = time.perf_counter() - t0
        finally:
            if name == "watch":
                own_s.append((w.check_s["steps"] - own0) / max(1, counter.n))
                w.flush()  # the ring's analysis belongs to the watched side, not to a step
                watch.suspend()
        return dt, counter.n, ctx

    for name in use:  # warm-up: first-call compilation, caches, every arm once
        once(name)
    times: dict[str, list[float]] = {n: [] for n in use}
    nsteps = None
    deferred: dict[str, list[float]] = {}  # per arm with deferred host copies
    for _ in range(a.rounds):
        for name in use:
            dt, n, ctx = once(name)
            nsteps = n
            times[name].append(dt / max(1, n))
            if hasattr(ctx, "materialize"):
                t0 = time.perf_counter()
                ctx.materialize()
                deferred.setdefault(name, []).append((time.perf_counter() - t0) / max(1, n))
    base = statistics.median(times["none"])
    res = {"benchmark": "step_overhead", "device": _device(), "config": cfg.to_dict(),
           "batch": a.batch, "budget": budget, "max_tokens": a.max_tokens, "rounds": a.rounds,
           "steps_per_generate": nsteps, "vllm": eng.effective["vllm_version"],
           "ms_per_step": {n: 1e3 * statistics.median(t) for n, t in times.items()},
           "ratio": {n: statistics.median(t) / base for n, t in times.items()},
           "trace_materialize_us_per_step": 1e6 * statistics.median(deferred["trace"])
           if deferred.get("trace") else None,
           "materialize_us_per_step": {n: 1e6 * statistics.median(d)
                                       for n, d in deferred.items()}}
    if own_s:
        res["watch_own_ms_per_step"] = 1e3 * statistics.median(own_s)
        res["watch_own_fraction"] = res["watch_own_ms_per_step"] / res["ms_per_step"]["watch"]
        res["watch_unexpected_changes"] = w.read().get("n_changes")
    if a.sync_check:
        res["syncs_per_step"] = {n: _syncs(lambda n=n: once(n)) for n in use}
    if a.count_ops:
        counted = {n: _ops(lambda mode, n=n: once(n, lambda: mode)) for n in use}
        res["ops_per_step"] = {n: c["ops"] for n, c in counted.items()}
        res["workbook_ops_per_step"] = {n: c["workbook"] for n, c in counted.items()}
        res["workbook_host_ops_per_step"] = {n: c["host"] for n, c in counted.items()}
        res["workbook_host_op_sites"] = {n: c["host_sites"] for n, c in counted.items()
                                         if c["host_sites"]}
        if "constraints" in counted and "trace" in counted:
            res["constraints_vs_trace_workbook_ops"] = (
                counted["constraints"]["workbook"] / max(1e-9, counted["trace"]["workbook"]))
    for n in use:
        extra = ""
        s = (res.get("syncs_per_step") or {}).get(n)
        if s is not None:
            extra += f"   syncs/step {s['all']:6.2f} (workbook {s['workbook']:.2f})"
        if "ops_per_step" in res:
            extra += (f"   ops/step {res['ops_per_step'][n]:8.1f} (workbook "
                      f"{res['workbook_ops_per_step'][n]:6.1f}, host "
                      f"{res['workbook_host_ops_per_step'][n]:.2f})")
        if n == "watch" and own_s:
            extra += (f"   watch's own {res['watch_own_ms_per_step']:.3f} ms/step "
                      f"({100 * res['watch_own_fraction']:.2f} %)")
        print(f"{n:12s} {res['ms_per_step'][n]:9.3f} ms/step   ratio {res['ratio'][n]:.3f}"
              + extra)
    print(json.dumps(res))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
    if a.matrix:
        from workbook import batch

        run_dir = batch.execute(env, out=a.out, only=a.matrix, progress=False, report=False,
                                executor="in-process")
        print("matrix:", run_dir, flush=True)
    os._exit(0)


def _syncs(run) -> dict | None:
    """Synchronizations per step of one generate: all, and those raised from workbook code."""
    import torch

    if not torch.cuda.is_available():
        return None
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _dt, n, _ctx = run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [g for g in got if "synchroniz" in str(g.message).lower()]
    mine = [g for g in syncs if f"{os.sep}workbook{os.sep}" in (g.filename or "")]
    n = max(1, n)
    return {"all": len(syncs) / n, "workbook": len(mine) / n,
            "workbook_sites": sorted({f"{os.path.basename(g.filename)}:{g.lineno}"
                                      for g in mine})}


HOST_OPS = ("aten.lift_fresh.default", "aten._local_scalar_dense.default")


def _ops(run) -> dict:
    """Per step of one generate: aten operators dispatched (all), those issued from workbook
    code, and those of workbook code that build a tensor from host data or read a device value
    (``HOST_OPS``: a synchronization on a GPU), with their sites."""
    import sys

    from torch.utils._python_dispatch import TorchDispatchMode

    wb = f"{os.sep}workbook{os.sep}"

    class Count(TorchDispatchMode):
        n = mine = host = 0
        sites: set = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            f = sys._getframe(1)
            while f is not None and f"{os.sep}torch{os.sep}" in f.f_code.co_filename:
                f = f.f_back
            if f is not None and wb in f.f_code.co_filename:
                Count.mine += 1
                if str(func) in HOST_OPS:
                    Count.host += 1
                    Count.sites.add(f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
            return func(*args, **(kwargs or {}))

    _dt, n, _ctx = run(Count())
    n = max(1, n)
    return {"ops": Count.n / n, "workbook": Count.mine / n, "host": Count.host / n,
            "host_sites": sorted(Count.sites)}


class _StepCounter:
    """Counts engine steps of one generate (a hook on the runner's sample_tokens)."""

    def __init__(self):
        from workbook.vllm import hookpoints
        from workbook.vllm.patching import PatchSet

        self.n = 0
        self._ps = PatchSet("bench:steps", "trace")
        self._ps.wrap(hookpoints.resolve().runner, "sample_tokens", self._make)

    def _make(self, orig):
        counter = self

        def sample_tokens(runner, *a, **k):
            counter.n += 1
            return orig(runner, *a, **k)
        return sample_tokens

    def __enter__(self):
        self._ps.install()
        return self

    def __exit__(self, *exc):
        self._ps.remove()
        return False


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
