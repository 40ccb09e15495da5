#!/usr/bin/env python3
"""GPU cost, per engine step, of the evidence issue #12 added to the tracer — at the reporter's
shape, with torch alone (no vLLM needed on the GPU host).

The tracer's own methods (``workbook.hooks.observe.tracer.Tracer``) run on synthetic CUDA tensors of the
shape the reporter's step has: vocab 248320, ``max_model_len`` 262144, a batch of ``--batch``
requests with k = 4 drafts (``batch * 5`` logits rows), the history of each request
``--history`` tokens long. Per step, in the order the tracer runs them: the full copy of the
logits before ``apply``, the state the scan kernel reads (marker caches before, budget, total
length, history checksum), the marker ids the forcing kernel reads, the bias columns across
``apply`` (top-2 of after - before, count >= 1e8), and what the sampler consumes (end columns,
top-2). No host synchronisation in the loop; one at the end.

Prints host µs per step (the Python + launch time that lands on the engine's step path in eager
mode) and device µs per step (CUDA events), and both as a share of the step times measured on
the H200 at the reporter's shape (brief §7: 78 ms eager / 21 ms CUDA graphs, batch 4).

    python3 benchmarks/evidence_gpu.py [--steps 300] [--batch 4] [--history 64] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEP_MS = {"eager": 78.0, "cuda_graphs": 21.0}  # H200, reporter's 27B shape, batch 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--max-model-len", type=int, default=262144)
    ap.add_argument("--max-num-reqs", type=int, default=256)
    ap.add_argument("--history", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()

    import numpy as np
    import torch

    from workbook.hooks.observe.tracer import Tracer, _Call, _Step

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    i32 = torch.int32
    rows = a.batch * (a.k + 1)
    t = Tracer.__new__(Tracer)  # the tracer's helpers, without resolving vLLM's hook points
    t.topk, t._weights, t._marker_ptrs, t._end_cols = 5, None, None, [248069 % a.vocab]
    t._end_idx = {}  # device -> the end columns' index (Tracer.__init__ sets it)
    req_ids = [f"r{i}" for i in range(a.batch)]
    t._len_ub = {r: a.history + 5 for r in req_ids}
    t._step = _Step(index=0, req_ids=req_ids, idx_mapping=np.arange(a.batch),
                    idx_mapping_dev=None, cu_num_logits=np.arange(a.batch + 1) * (a.k + 1),
                    num_draft_tokens=a.batch * a.k)
    logits = torch.randn(rows, a.vocab, device=dev)
    all_tok = torch.randint(0, a.vocab, (a.max_num_reqs, a.max_model_len), dtype=i32,
                            device=dev)
    total_len = torch.full((a.max_num_reqs,), a.history, dtype=i32, device=dev)
    budget = torch.full((a.max_num_reqs,), 1, dtype=i32, device=dev)
    caches = [torch.full((a.max_num_reqs,), -1, dtype=i32, device=dev) for _ in range(2)] + \
        [torch.zeros(a.max_num_reqs, dtype=i32, device=dev)]
    markers = [torch.tensor([248068 % a.vocab], dtype=i32, device=dev),
               torch.tensor([248069 % a.vocab], dtype=i32, device=dev),
               torch.tensor([248069 % a.vocab], dtype=i32, device=dev)]
    idx = torch.arange(a.batch, dtype=i32, device=dev)

    def one_step():
        rec = {}
        before = logits.detach().clone()  # apply entry
        t._read_state(rec, idx.long(), budget, all_tok, total_len, *caches)  # scan launch
        t._read_markers(rec, markers)  # forcing launch
        logits[:, t._end_cols[0]] = 1e9  # (the kernel's write)
        t._bias_delta(rec, logits, before)  # apply exit
        t._consumed(_Call(), logits)  # the sampler's input
        return rec

    for _ in range(20):  # warm-up (allocator, first launches)
        one_step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    h0 = time.perf_counter()
    for _ in range(a.steps):
        one_step()
    host_s = time.perf_counter() - h0
    if dev.type == "cuda":
        e1.record()
        torch.cuda.synchronize()
        dev_ms = e0.elapsed_time(e1)
    else:
        dev_ms = 1e3 * host_s
    host_us, dev_us = 1e6 * host_s / a.steps, 1e3 * dev_ms / a.steps
    res = {"benchmark": "evidence_gpu", "device": torch.cuda.get_device_name(0)
           if dev.type == "cuda" else "cpu", "torch": torch.__version__, "rows": rows,
           "vocab": a.vocab, "batch": a.batch, "history": a.history, "steps": a.steps,
           "host_us_per_step": host_us, "device_us_per_step": dev_us,
           **{f"share_of_{m}_step": max(host_us, dev_us) / (1e3 * ms)
              for m, ms in STEP_MS.items()}}
    print(f"{res['device']}: +{host_us:.0f} µs host, +{dev_us:.0f} µs device per step "
          f"({rows} rows × {a.vocab}); share of a step: "
          + ", ".join(f"{m} {100 * res[f'share_of_{m}_step']:.2f} %" for m in STEP_MS))
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
