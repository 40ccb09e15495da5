#!/usr/bin/env python3
"""The tracer's and the guard's step ratio with tensor parallel 2 beside tensor parallel 1, in ONE
run (issue #29, docs/parallel.md).

For each ``--tp`` size (default ``1,2``), one engine (a child process of this script, so only one
engine tree is alive at a time); the hooks go into every worker the way the plugin puts them
there for a run with several ranks (``workbook.hooks.plugin``): through vLLM's own
``LLM.collective_rpc``, which runs a function in every worker process (with tensor parallel 1,
the one in-process worker). Arms, interleaved per round (``--rounds``) so drift hits all of them:

- ``none``        vLLM alone
- ``trace``       ``workbook.hooks.observe.tracer.Tracer`` flushed to ``<dir>/<pid>/`` after every step
                  (what the plugin installs in each rank: ``WORKBOOK_TRACE_FLUSH_EVERY=1``)
- ``guard``       ``workbook.hooks.guard``
- ``trace+guard`` both
- ``plugin``      both, and the guard's report written next to the trace with every flush: what
                  the plugin installs in each rank for a run with the guard
                  (``workbook.hooks.plugin._guard_report_on_flush``)

The request batch is ``workbook.run.request.run_reported`` (``--batch`` copies, thinking budget
``--budget``, ``ignore_eos``: every request runs ``--max-tokens`` tokens). Steps are counted in
rank 0's worker (its ``sample_tokens``). Prints, per arm, ms per step and the ratio to ``none``
for every tp side by side, and one JSON line (``--json-out``).

    python benchmarks/step_overhead_tp.py --json-out outputs/cpu/benchmarks/step_overhead_tp.json

On the CPU (2 cores, Triton's interpreter) tensor parallel 1 runs on both cores and tensor
parallel 2 binds one core per rank: compare ratios, not the absolute times across tp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = ("none", "trace", "guard", "trace+guard", "plugin")


# ---- run inside every worker process (vLLM's collective_rpc passes the worker as `worker`) ------

def _w_count(worker):
    """Install a step counter on the runner class (once); returns (pid, steps so far)."""
    import os

    from workbook.vllm import hookpoints
    from workbook.vllm.patching import PatchSet

    st = worker.__dict__.setdefault("_wb_bench", {"n": 0})
    if "counter" not in st:
        def make(orig):
            def sample_tokens(runner, *a, **k):
                st["n"] += 1
                return orig(runner, *a, **k)
            return sample_tokens
        ps = PatchSet("bench:steps", "trace")
        ps.wrap(hookpoints.resolve().runner, "sample_tokens", make)
        ps.install()
        st["counter"] = ps
    return os.getpid(), st["n"]


def _w_on(worker, arm, trace_dir):
    import os

    from workbook.hooks import guard, plugin
    from workbook.hooks.observe.tracer import Tracer

    st = worker.__dict__.setdefault("_wb_bench", {"n": 0})
    if "guard" in arm or arm == "plugin":
        guard.install()
    if "trace" in arm or arm == "plugin":
        st["tracer"] = Tracer(flush_dir=os.path.join(trace_dir, str(os.getpid())),
                              flush_every=1).install()
    if arm == "plugin":
        plugin._RUNNERS[:] = [worker.model_runner]
        plugin._guard_report_on_flush(st["tracer"])
    return os.getpid()


def _w_off(worker):
    from workbook.hooks import guard

    st = worker.__dict__.get("_wb_bench", {})
    tracer = st.pop("tracer", None)
    if tracer is not None:
        tracer.remove()
    guard.remove()
    from workbook.hooks import plugin

    plugin._RUNNERS[:] = []
    return True


def _w_rank(worker):
    from workbook.hooks.plugin import rank_info

    return rank_info()


# ---- one tp size: a child process ---------------------------------------------------------------

def child(a) -> dict:
    from workbook.core.config import RunConfig
    from workbook.run import request
    from workbook.vllm import engine

    cfg = RunConfig(**{"spec_method": "mtp", "num_spec_tokens": 4, "max_num_seqs": 8,
                       "tensor_parallel_size": int(a.tp), **json.loads(a.cfg)})
    t0 = time.perf_counter()
    eng = engine.shared(cfg)
    start_s = time.perf_counter() - t0
    llm = eng.llm
    ranks = llm.collective_rpc(_w_rank)
    budget = None if a.budget < 0 else a.budget
    trace_dir = tempfile.mkdtemp(prefix="wb-bench-tp-")

    def once(arm):
        llm.collective_rpc(_w_on, args=(arm, trace_dir))
        try:
            n0 = llm.collective_rpc(_w_count)[0][1]
            t = time.perf_counter()
            request.run_reported(eng, budget=budget, n=a.batch, max_tokens=a.max_tokens)
            dt = time.perf_counter() - t
            n = llm.collective_rpc(_w_count)[0][1] - n0
        finally:
            llm.collective_rpc(_w_off)
        return dt, n

    for arm in ARMS:  # warm-up: every arm once
        once(arm)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    steps = None
    for _ in range(a.rounds):
        for arm in ARMS:
            dt, n = once(arm)
            steps = n
            times[arm].append(dt / max(1, n))
    base = statistics.median(times["none"])
    return {"tp": int(a.tp), "start_s": start_s, "ranks": ranks, "steps_per_generate": steps,
            "vllm": eng.effective.get("vllm_version"),
            "ms_per_step": {k: 1e3 * statistics.median(v) for k, v in times.items()},
            "ratio": {k: statistics.median(v) / base for k, v in times.items()},
            # the fastest round of each arm: less sensitive to other processes on the cores
            "ratio_min": {k: min(v) / min(times["none"]) for k, v in times.items()},
            "ms_per_step_all": {k: [1e3 * x for x in v] for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", default="1,2", help="tensor parallel sizes, comma-separated")
    ap.add_argument("--cfg", default="{}", help="RunConfig fields (JSON)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--budget", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json-out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        res = child(a)
        print("RESULT " + json.dumps(res), flush=True)
        os._exit(0)

    sizes = [int(x) for x in a.tp.split(",")]
    results = {}
    for tp in sizes:  # one engine tree at a time: each tp in its own child process
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--tp", str(tp),
               "--cfg", a.cfg, "--batch", str(a.batch), "--budget", str(a.budget),
               "--max-tokens", str(a.max_tokens), "--rounds", str(a.rounds)]
        t = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            sys.exit(f"tp={tp}: the child failed (rc {p.returncode}): "
                     + (p.stderr.strip().splitlines() or ["no output"])[-1])
        results[tp] = json.loads(line[len("RESULT "):])
        results[tp]["wall_s"] = time.perf_counter() - t
    print(f"{'arm':12s}" + "".join(f"   tp{tp} ms/step   ratio  (fastest-round ratio)"
                                   for tp in sizes))
    for arm in ARMS:
        print(f"{arm:12s}" + "".join(f"   {results[tp]['ms_per_step'][arm]:11.1f}   "
                                     f"{results[tp]['ratio'][arm]:5.3f}  "
                                     f"({results[tp]['ratio_min'][arm]:5.3f})           "
                                     for tp in sizes))
    out = {"benchmark": "step_overhead_tp", "device": "cpu", "batch": a.batch,
           "load_average": os.getloadavg(),
           "budget": a.budget, "max_tokens": a.max_tokens, "rounds": a.rounds,
           "cores": len(os.sched_getaffinity(0)), "date": time.strftime("%Y-%m-%d"),
           "by_tp": {str(tp): r for tp, r in results.items()}}
    print(json.dumps(out))
    if a.json_out:
        os.makedirs(os.path.dirname(a.json_out) or ".", exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
