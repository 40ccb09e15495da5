#!/usr/bin/env python3
"""The guard kernel alone: µs per engine step on the GPU, launched eagerly and replayed in a
CUDA graph (as it would run inside MRV2's captured decode step).

Shapes of a decode step with MTP k: ``sampled`` [num_reqs, k+1], every request with a budget,
the boundary inside the window (so the kernel walks and replaces tokens). Prints one line per
(num_reqs, k) and a JSON line. GPU only (on a CPU the kernel runs in Triton's interpreter).

    python benchmarks/guard_kernel.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json


def one(num_reqs: int, k: int, reps: int = 2000) -> dict:
    import torch

    from workbook.hooks import guard

    d = torch.device("cuda")
    i32 = torch.int32
    n = max(256, num_reqs)
    start, end = (368,), (369,)  # marker ids: compile-time constants of the kernel
    sampled = torch.zeros((num_reqs, k + 1), dtype=torch.int64, device=d)
    num_sampled = torch.full((num_reqs,), k + 1, dtype=i32, device=d)
    num_rejected = torch.zeros(num_reqs, dtype=i32, device=d)
    idx = torch.arange(num_reqs, dtype=i32, device=d)
    budget = torch.full((n,), 10**6, dtype=i32, device=d)  # never binds: state advances only
    count = torch.zeros(n, dtype=i32, device=d)
    tail = torch.full((n, 1), -1, dtype=i32, device=d)
    fixed_rows = torch.zeros(n, dtype=i32, device=d)
    fixed_total = torch.zeros(1, dtype=i32, device=d)

    def step():
        guard.launch_guard_kernel(sampled, num_sampled, num_rejected, idx, budget, count, tail,
                                  fixed_rows[:num_reqs], fixed_total, start, end, end)

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(reps):
        step()
    ev[1].record()
    torch.cuda.synchronize()
    eager_us = 1e3 * ev[0].elapsed_time(ev[1]) / reps
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        step()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(100):
                step()
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(reps // 100):
        g.replay()
    ev[1].record()
    torch.cuda.synchronize()
    graph_us = 1e3 * ev[0].elapsed_time(ev[1]) / (reps // 100 * 100)
    return {"num_reqs": num_reqs, "k": k, "eager_us_per_step": eager_us,
            "graph_us_per_step": graph_us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch

    from vllm.triton_utils import triton  # noqa: F401  (Triton through vLLM, as the guard does)

    res = {"benchmark": "guard_kernel", "device": torch.cuda.get_device_name(0), "cases": []}
    for num_reqs, k in ((1, 4), (8, 4), (64, 4), (256, 4), (8, 0)):
        r = one(num_reqs, k)
        res["cases"].append(r)
        print(f"num_reqs={num_reqs:4d} k={k}: eager {r['eager_us_per_step']:.2f} µs/step, "
              f"CUDA graph {r['graph_us_per_step']:.2f} µs/step")
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
