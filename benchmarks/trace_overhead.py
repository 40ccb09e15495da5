#!/usr/bin/env python3
"""Tracer overhead: step time traced / untraced, measured side by side in one engine run.

One engine; the same greedy request batch is generated alternately without and with the tracer
(``--reps`` pairs, interleaved so drift hits both arms). Prints, as text and one JSON line:
engine steps per generate, median wall time per step untraced and traced, their ratio, the
tracer's added µs per step, the µs per step spent later turning the trace into tables (off the
engine's path: ``Tracer.materialize``), and the bytes of trace per logits row (parquet).

    python benchmarks/trace_overhead.py                      # CPU: tiny dense MTP model
    python benchmarks/trace_overhead.py --model tiny-qwen3.5-mtp --engine-kwargs \
        '{"gdn_prefill_backend": "triton"}' --kv-cache-bytes 1073741824   # GPU

Absolute times mean something only on the GPU; on the CPU (Triton interpreter) read the ratio.
``--budget`` (default 8) gives every request a thinking budget, so that the budget's kernels
run every step and the tracer reads what they read (device markers, marker caches, budget,
history checksum, bias columns, the tensor sampled); ``--budget -1`` sends no budget (the
logits-processing fast path: what results before issue #12 measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-mimo-mtp")
    ap.add_argument("--spec", default="mtp")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--budget", type=int, default=8, help="thinking budget (-1: none)")
    ap.add_argument("--kv-cache-bytes", type=int, default=64 << 20)
    ap.add_argument("--engine-kwargs", default="{}")
    ap.add_argument("--json-out")
    a = ap.parse_args()

    from workbook.core.config import RunConfig
    from workbook.hooks.tracer import Tracer
    from workbook.run import request
    from workbook.vllm import engine

    cfg = RunConfig(model=a.model, spec_method=a.spec, num_spec_tokens=a.k,
                    kv_cache_bytes=a.kv_cache_bytes, max_tokens=a.max_tokens,
                    engine_kwargs=json.loads(a.engine_kwargs), max_num_seqs=max(8, a.batch))
    eng = engine.start(cfg)
    budget = None if a.budget < 0 else a.budget

    def once(tracer=None):
        t0 = time.perf_counter()
        if tracer is None:
            request.run_reported(eng, budget=budget, n=a.batch)
        else:
            with tracer:
                request.run_reported(eng, budget=budget, n=a.batch)
        return time.perf_counter() - t0

    once()  # warm-up (first-call compilation, caches)
    probe = Tracer(topk=a.topk)
    once(probe)
    steps = len(probe.steps)
    plain, traced, materialize = [], [], []
    last = None
    for _ in range(a.reps):
        plain.append(once())
        last = Tracer(topk=a.topk)
        traced.append(once(last))
        t0 = time.perf_counter()
        last.materialize()  # host copies + table rows: deferred, off the engine's step path
        materialize.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        paths = last.save(d)
        nbytes = sum(os.path.getsize(p) for p in paths)
    rows = max(1, len(last.rows))
    p_med, t_med = statistics.median(plain), statistics.median(traced)
    res = {"benchmark": "trace_overhead", "device": _device(), "model": a.model, "spec": a.spec,
           "k": a.k, "batch": a.batch, "budget": budget, "steps_per_generate": steps,
           "reps": a.reps,
           "untraced_ms_per_step": 1e3 * p_med / steps, "traced_ms_per_step": 1e3 * t_med / steps,
           "ratio_traced_over_untraced": t_med / p_med,
           "added_us_per_step": 1e6 * (t_med - p_med) / steps,
           "materialize_us_per_step": 1e6 * statistics.median(materialize) / steps,
           "trace_rows": len(last.rows), "trace_bytes": nbytes, "bytes_per_row": nbytes / rows,
           "vllm": eng.effective["vllm_version"]}
    print(f"{res['device']}: {steps} steps/generate, untraced {res['untraced_ms_per_step']:.3f} "
          f"ms/step, traced {res['traced_ms_per_step']:.3f} ms/step → ratio "
          f"{res['ratio_traced_over_untraced']:.3f} (+{res['added_us_per_step']:.0f} µs/step; "
          f"reading the trace later: {res['materialize_us_per_step']:.0f} µs/step); "
          f"{res['bytes_per_row']:.0f} bytes of trace per row")
    print(json.dumps(res))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
    os._exit(0)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
