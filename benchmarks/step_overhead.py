#!/usr/bin/env python3
"""What each hook costs per engine step, side by side in ONE engine run: ratios, not timings.

One engine; the same request batch (the reported request, ``--batch`` copies with thinking
budget ``--budget`` — ``ignore_eos``, so every request runs ``--max-tokens`` tokens and the budget
state is live every step) is generated once per arm and round, the arms interleaved
(``--rounds``) so drift hits all of them. Arms: ``none`` (vLLM alone), ``trace``
(``workbook.hooks.observe.tracer``; its deferred host copies are timed separately), ``guard``
(``workbook.hooks.guard``), ``constraints`` or its alias ``rowcheck`` (the row check of every
per-request sampling constraint, ``workbook.hooks.observe.rowcheck``; its deferred host copies are
timed separately too),
``trace+constraints`` (both collectors on one ``workbook.hooks.observe.observer``, as
``workbook.hooks.install`` puts them for a run that asks for both; the step's outputs recorded
once for both by ``workbook.hooks.observe.outputs``), ``watch`` (the start-up
watch's per-step ring check after start-up:
the engine is then started with the watch in place, ``--watch``, and every other arm runs with
it suspended; also the watch's own time per step, from its counters), ``trace+guard``. Prints
one line per arm — median ms per step and its ratio to ``none`` — and one JSON line.

Sampling: ``--sampling JSON`` (repeatable; default greedy) gives every request those
``SamplingParams`` fields, e.g. ``--sampling '{}' --sampling '{"temperature": 0.8, "seed": 1}'``:
greedy and sampled with a seed on the SAME engine, every arm of every sampling interleaved in
each round, each sampling's ratios against its own ``none`` (the guard's take-back redraws a
seeded sampled step under speculative decoding: its cost shows in the sampled ``guard`` ratio).
The JSON's top-level ``ms_per_step`` / ``ratio`` are the first sampling's; ``by_sampling`` holds
each one's.

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
    python benchmarks/step_overhead.py --arms none,guard,rowcheck --sampling '{}' \
        --sampling '{"temperature": 0.8, "seed": 1}'                   # greedy and sampled

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
             "trace+guard": both, "constraints": RowCheck, "rowcheck": RowCheck,
             "trace+constraints": trace_rows}
    if watch_on:
        table["watch"] = contextlib.nullcontext  # the watch is resumed around it (main)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"step_overhead: arm(s) {', '.join(unknown)} unknown (known: "
                         f"{', '.join(table)}{'' if watch_on else '; watch needs --watch'})")
    return {n: table[n] for n in names}


def samplings(raw: list[str]) -> list[dict]:
    """``--sampling`` values: JSON objects of ``SamplingParams`` fields (default: greedy)."""
    out = []
    for r in raw or ["{}"]:
        try:
            d = json.loads(r)
        except json.JSONDecodeError as e:
            raise SystemExit(f"step_overhead: --sampling {r!r} is not JSON ({e.msg})")
        if not isinstance(d, dict):
            raise SystemExit(f"step_overhead: --sampling {r!r} is not a JSON object")
        out.append(d)
    return out


def label(sp: dict) -> str:
    """``greedy`` or ``temperature=0.8,seed=1``."""
    return ",".join(f"{k}={v}" for k, v in sp.items()) or "greedy"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cfg", default="{}", help="RunConfig fields (JSON; with --env: overrides "
                    "of that run's, e.g. a shorter max_model_len for a card with less memory)")
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
    ap.add_argument("--sampling", action="append", default=[], metavar="JSON",
                    help="SamplingParams fields of every request (repeatable: each sampling its "
                         "own arms, all interleaved on one engine; default greedy)")
    ap.add_argument("--json-out")
    a = ap.parse_args()

    from workbook.core.config import RunConfig
    from workbook.run import request
    from workbook.vllm import engine

    if a.env:
        from workbook import batch

        env = batch.load_environment(a.env, notebooks=False)
        (spec,) = batch.select(env, [a.run])
        cfg = RunConfig.from_params(spec.params).replace(fault="none", guard=False,
                                                         **json.loads(a.cfg))
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
    if "none" not in use:
        raise SystemExit("step_overhead: --arms must hold none (the ratios' denominator)")
    sps = samplings(a.sampling)
    budget = None if a.budget < 0 else a.budget
    own_s: list[float] = []  # the watch's own seconds per step (its counters), per watched run

    def generate(sp):
        request.run_budgets(eng, [budget] * a.batch, a.max_tokens, **sp)

    def once(name, around=contextlib.nullcontext, sp=sps[0]):
        ctx = use[name]()
        counter = _StepCounter()
        if name == "watch":
            watch.resume()
            own0 = w.check_s["steps"]
        try:
            with around():
                t0 = time.perf_counter()
                with counter, ctx:
                    generate(sp)
                _sync()
                dt = time.perf_counter() - t0
        finally:
            if name == "watch":
                own_s.append((w.check_s["steps"] - own0) / max(1, counter.n))
                w.flush()  # the ring's analysis belongs to the watched side, not to a step
                watch.suspend()
        return dt, counter.n, ctx

    for sp in sps:  # warm-up: first-call compilation, caches, every arm once
        for name in use:
            once(name, sp=sp)
    times = {label(sp): {n: [] for n in use} for sp in sps}
    nsteps = {label(sp): None for sp in sps}
    deferred: dict[str, list[float]] = {}  # per arm with deferred host copies (first sampling)
    for r in range(a.rounds):
        for sp in sps:
            for name in use:
                dt, n, ctx = once(name, sp=sp)
                nsteps[label(sp)] = n
                times[label(sp)][name].append(dt / max(1, n))
                if hasattr(ctx, "materialize"):
                    t0 = time.perf_counter()
                    ctx.materialize()
                    if sp is sps[0]:
                        deferred.setdefault(name, []).append((time.perf_counter() - t0) / max(1, n))
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    by = []
    for sp in sps:
        t = times[label(sp)]
        base = statistics.median(t["none"])
        by.append({"sampling": sp, "label": label(sp), "steps_per_generate": nsteps[label(sp)],
                   "ms_per_step": {n: 1e3 * statistics.median(v) for n, v in t.items()},
                   "ratio": {n: statistics.median(v) / base for n, v in t.items()}})
    res = {"benchmark": "step_overhead", "device": _device(), "config": cfg.to_dict(),
           "batch": a.batch, "budget": budget, "max_tokens": a.max_tokens, "rounds": a.rounds,
           "steps_per_generate": by[0]["steps_per_generate"],
           "vllm": eng.effective["vllm_version"], "sampling": sps[0],
           "ms_per_step": by[0]["ms_per_step"], "ratio": by[0]["ratio"], "by_sampling": by,
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
    for i, b in enumerate(by):
        if len(by) > 1:
            print(f"-- sampling {b['label']} ({b['steps_per_generate']} steps per generate)")
        for n in use:
            extra = ""
            s = (res.get("syncs_per_step") or {}).get(n) if i == 0 else None
            if s is not None:
                extra += f"   syncs/step {s['all']:6.2f} (workbook {s['workbook']:.2f})"
            if "ops_per_step" in res and i == 0:
                extra += (f"   ops/step {res['ops_per_step'][n]:8.1f} (workbook "
                          f"{res['workbook_ops_per_step'][n]:6.1f}, host "
                          f"{res['workbook_host_ops_per_step'][n]:.2f})")
            if n == "watch" and own_s and i == 0:
                extra += (f"   watch's own {res['watch_own_ms_per_step']:.3f} ms/step "
                          f"({100 * res['watch_own_fraction']:.2f} %)")
            print(f"{n:12s} {b['ms_per_step'][n]:9.3f} ms/step   ratio {b['ratio'][n]:.3f}"
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
