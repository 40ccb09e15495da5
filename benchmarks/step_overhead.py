#!/usr/bin/env python3
"""What each hook costs per engine step, side by side in ONE engine run: ratios, not timings.

One engine; the same request batch (the reported request, ``--batch`` copies, no budget so every
request runs ``--max-tokens`` tokens) is generated once per arm and round, the arms interleaved
(``--rounds``) so drift hits all of them. Arms: ``none`` (vLLM alone), ``trace``
(``workbook.hooks.tracer``; its deferred host copies are timed separately), ``guard``
(``workbook.hooks.guard``), ``watch`` (the integrity watch's per-step check, when the installed
workbook has one), ``trace+guard``. Prints one line per arm — median ms per step and its ratio to
``none`` — and one JSON line.

    python benchmarks/step_overhead.py                                   # CPU, tiny dense MTP
    python benchmarks/step_overhead.py --cfg '{"model": "qwen3.5-27b-shape", "max_model_len":
        262144, "kv_cache_bytes": null, "gpu_memory_utilization": 0.9, "enforce_eager": false,
        "engine_kwargs": {"gdn_prefill_backend": "triton"}}'             # the reporter's shape

Absolute times mean something only on the GPU; on the CPU (Triton interpreter) read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time


def arms(names):
    from workbook.hooks import guard
    from workbook.hooks.tracer import Tracer

    def trace():
        return Tracer()

    def both():
        stack = contextlib.ExitStack()
        stack.enter_context(guard.enabled())
        stack.enter_context(Tracer())
        return stack

    table = {"none": contextlib.nullcontext, "trace": trace, "guard": guard.enabled,
             "trace+guard": both}
    try:
        from workbook.hooks import watch  # the integrity watch (per-step check after start-up)

        if hasattr(watch, "step_watch"):
            table["watch"] = watch.step_watch
    except ImportError:
        pass
    return {n: table[n] for n in names if n in table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cfg", default="{}", help="RunConfig fields (JSON)")
    ap.add_argument("--env", help="take the engine configuration from this environment's run")
    ap.add_argument("--run", help="... named RUN (with --env)")
    ap.add_argument("--matrix", nargs="*", default=[],
                    help="afterwards, run these runs of --env in-process on the same engine")
    ap.add_argument("--out", default="outputs", help="output root for --matrix")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arms", default="none,trace,guard,watch,trace+guard")
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
    eng = engine.shared(cfg)  # --matrix runs with the same engine arguments reuse it
    use = arms(a.arms.split(","))
    steps = {"n": 0}

    def once(ctx):
        counter = _StepCounter(steps)
        t0 = time.perf_counter()
        with counter, ctx:
            request.run_reported(eng, budget=None, n=a.batch, max_tokens=a.max_tokens)
        _sync()
        return time.perf_counter() - t0, counter.n, ctx

    for make in use.values():  # warm-up: first-call compilation, caches, every arm once
        once(make())
    times: dict[str, list[float]] = {n: [] for n in use}
    nsteps = None
    deferred = []
    for _ in range(a.rounds):
        for name, make in use.items():
            dt, n, ctx = once(make())
            nsteps = n
            times[name].append(dt / max(1, n))
            if hasattr(ctx, "materialize"):
                t0 = time.perf_counter()
                ctx.materialize()
                deferred.append((time.perf_counter() - t0) / max(1, n))
    base = statistics.median(times["none"])
    res = {"benchmark": "step_overhead", "device": _device(), "config": cfg.to_dict(),
           "batch": a.batch, "max_tokens": a.max_tokens, "rounds": a.rounds,
           "steps_per_generate": nsteps, "vllm": eng.effective["vllm_version"],
           "ms_per_step": {n: 1e3 * statistics.median(t) for n, t in times.items()},
           "ratio": {n: statistics.median(t) / base for n, t in times.items()},
           "trace_materialize_us_per_step": 1e6 * statistics.median(deferred) if deferred
           else None}
    for n in use:
        print(f"{n:12s} {res['ms_per_step'][n]:9.3f} ms/step   ratio {res['ratio'][n]:.3f}")
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


class _StepCounter:
    """Counts engine steps of one generate (a hook on the runner's sample_tokens)."""

    def __init__(self, shared):
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
