#!/usr/bin/env python3
"""The guard on the GPU without an engine: its kernel's cost, its whole per-step cost, and its
exactness while a raw writer corrupts its device state.

1. ``kernel``: ``guard.launch`` alone, µs per step, launched eagerly and replayed in a CUDA graph
   (as it would run inside a captured decode step). Shapes of a decode step with MTP k:
   ``sampled`` [num_reqs, k+1], every request with a budget that never binds (the walk runs
   over every token).
2. ``enforce``: ``GuardState.enforce`` as the engine calls it — host truth rows staged in pinned
   memory and copied non-blocking, the kernel, the echo's non-blocking D2H copy, absorbing the
   previous step's echo — µs of host time per step and device µs per step (CUDA events).
3. ``--check``: ``GuardState`` over a simulated batch (mixed budgets, random sampled rows,
   row → slot not the identity, single- and multi-token end markers), a raw writer corrupting
   its replicas before every step (all three zeroed, two set to 7, one zeroed, every count
   1000, every budget -1 / 0): after every step each row's kept tokens must equal the budget
   rule (``workbook.core.budget``) walked over the full host history, rows without a budget
   unchanged; and the repairs are counted. Prints the mismatches (0 expected).

Without vLLM (a bare GPU host) Triton is used directly through a stand-in
``vllm.triton_utils``. Prints one line per case and a JSON line. GPU only.

    python benchmarks/guard_kernel.py [--check] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import types


def _triton_via_vllm_or_stub() -> str:
    try:
        import vllm.triton_utils  # noqa: F401

        return "vllm"
    except ImportError:
        import triton
        import triton.language as tl

        stub = types.ModuleType("vllm.triton_utils")
        stub.HAS_TRITON, stub.triton, stub.tl = True, triton, tl
        sys.modules.setdefault("vllm", types.ModuleType("vllm"))
        sys.modules["vllm.triton_utils"] = stub
        return f"triton {triton.__version__} (no vLLM)"


DEVICE = "cuda"  # --device cpu: the check alone, in Triton's interpreter (a smoke test)


def _fake_runner(markers, max_num_reqs: int):
    import torch

    rc = types.SimpleNamespace(reasoning_start_token_ids=list(markers[0]),
                               natural_reasoning_end_token_ids=list(markers[1]),
                               reasoning_end_token_ids=list(markers[2]))
    return types.SimpleNamespace(vllm_config=types.SimpleNamespace(reasoning_config=rc),
                                 device=torch.device(DEVICE),
                                 req_states=types.SimpleNamespace(max_num_reqs=max_num_reqs))


def kernel(num_reqs: int, k: int, reps: int = 2000) -> dict:
    import torch

    from workbook.hooks import guard

    d, i32 = torch.device("cuda"), torch.int32
    n = max(256, num_reqs)
    markers = guard.budget_markers((368,), (369,), (369,))
    sampled = torch.zeros((num_reqs, k + 1), dtype=torch.int64, device=d)
    num_sampled = torch.full((num_reqs,), k + 1, dtype=i32, device=d)
    num_rejected = torch.zeros(num_reqs, dtype=i32, device=d)
    reps3 = [guard.new_replica(n, 1, d) for _ in range(3)]
    truth = torch.zeros((num_reqs, guard.T_TAIL + 1), dtype=i32, device=d)
    truth[:, guard.T_SLOT] = torch.arange(num_reqs, dtype=i32, device=d)
    truth[:, guard.T_BUDGET] = 10**6  # never binds: the walk covers every token
    truth[:, guard.T_CURRENT] = 1
    for r in reps3:  # the replicas agree with the truth: nothing to repair
        b, c, t = guard.replica_views(r, n, 1)
        b.fill_(10**6)
        c.zero_()
    truth[:, guard.T_TAIL] = -1
    fixed_rows = torch.zeros(n, dtype=i32, device=d)
    counters = torch.zeros(2, dtype=i32, device=d)
    log = torch.zeros((16, guard.LOG_W), dtype=i32, device=d)
    echo = torch.zeros((num_reqs, guard.E_TOKENS + k + 1), dtype=i32, device=d)

    def step():
        truth[:, guard.T_COUNT] = 0  # the host's count each step (the walk then advances it)
        for r in reps3:
            guard.replica_views(r, n, 1)[1].zero_()
        guard.launch(sampled, num_sampled, num_rejected, truth, reps3, n, 1,
                     fixed_rows[:num_reqs], counters, log, echo, 0, markers)

    def plain():
        guard.launch(sampled, num_sampled, num_rejected, truth, reps3, n, 1,
                     fixed_rows[:num_reqs], counters, log, echo, 0, markers)

    step()
    torch.cuda.synchronize()
    assert int(counters[1]) == 0, "replicas and truth disagree in the benchmark's own setup"
    for _ in range(10):
        plain()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(reps):
        plain()
    ev[1].record()
    torch.cuda.synchronize()
    eager_us = 1e3 * ev[0].elapsed_time(ev[1]) / reps
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        plain()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(100):
                plain()
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(reps // 100):
        g.replay()
    ev[1].record()
    torch.cuda.synchronize()
    graph_us = 1e3 * ev[0].elapsed_time(ev[1]) / (reps // 100 * 100)
    return {"case": "kernel", "num_reqs": num_reqs, "k": k, "eager_us_per_step": eager_us,
            "graph_us_per_step": graph_us}


def _batch(num_reqs: int, k: int, markers, budgets, seed: int = 0):
    """A GuardState with ``num_reqs`` requests registered on shuffled slots."""
    from workbook.hooks import guard

    rng = random.Random(seed)
    max_reqs = 4 * num_reqs
    st = guard.GuardState(_fake_runner(markers, max_reqs))
    slots = rng.sample(range(max_reqs), num_reqs)
    ids = [f"req-{i}" for i in range(num_reqs)]
    hists = []
    for i, s in enumerate(slots):
        h = [rng.choice([0, 2, 4, 7]) for _ in range(rng.randint(1, 6))] + list(markers[0]) + \
            [0] * rng.randint(0, 3)
        hists.append(h)
        st.stage(s, budgets[i], h, ids[i])
    st.flush()
    return st, ids, hists


def enforce_cost(num_reqs: int, k: int, reps: int = 500) -> dict:
    import torch

    from workbook.hooks import guard

    st, ids, _ = _batch(num_reqs, k, ((368,), (369,), (369,)), [10**6] * num_reqs)
    d = torch.device("cuda")
    sampled = torch.zeros((num_reqs, k + 1), dtype=torch.int64, device=d)
    num_sampled = torch.full((num_reqs,), k + 1, dtype=torch.int32, device=d)
    num_rejected = torch.zeros(num_reqs, dtype=torch.int32, device=d)
    so, ib = types.SimpleNamespace(sampled_token_ids=sampled), types.SimpleNamespace(req_ids=ids)
    for _ in range(20):
        st.enforce(so, num_sampled, num_rejected, ib)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    host = 0.0
    ev[0].record()
    for _ in range(reps):
        t = time.perf_counter()
        st.enforce(so, num_sampled, num_rejected, ib)
        host += time.perf_counter() - t
    ev[1].record()
    torch.cuda.synchronize()
    st.catch_up(wait=True)
    return {"case": "enforce", "num_reqs": num_reqs, "k": k,
            "host_us_per_step": 1e6 * host / reps,
            "device_us_per_step": 1e3 * ev[0].elapsed_time(ev[1]) / reps,
            "lagged_rows": st.truth_lagged_rows, "repaired_fields": st.repaired_fields,
            "guard_module": guard.__name__}


CORRUPT = ("all-zero", "two-7", "one-zero", "count-1000", "budget-none", "budget-zero", "none")


def _corrupt(st, how: str) -> None:
    import torch

    from workbook.hooks import guard

    def raw(t):
        with torch.inference_mode():
            return torch.empty(0, dtype=t.dtype, device=t.device).set_(
                t.untyped_storage(), t.storage_offset(), t.size(), t.stride())

    with torch.inference_mode():
        _corrupt_raw(st, how, raw, guard)


def _corrupt_raw(st, how, raw, guard) -> None:
    views = [guard.replica_views(r, st.max_num_reqs, st.TAIL) for r in st.replicas]
    if how == "all-zero":
        [raw(r).fill_(0) for r in st.replicas]
    elif how == "two-7":
        [raw(r).fill_(7) for r in st.replicas[:2]]
    elif how == "one-zero":
        raw(st.replicas[2]).fill_(0)
    elif how == "count-1000":
        [raw(v[1]).fill_(1000) for v in views]
    elif how == "budget-none":
        [raw(v[0]).fill_(-1) for v in views]
    elif how == "budget-zero":
        [raw(v[0]).fill_(0) for v in views]


def check(markers, steps: int = 60, num_reqs: int = 8, k: int = 4, seed: int = 0) -> dict:
    import torch

    from workbook.core import budget

    rng = random.Random(seed)
    m = budget.Markers(markers[0], markers[2], markers[1])
    budgets = [rng.choice([None, 0, 1, 3, 6, 10]) for _ in range(num_reqs)]
    budgets[0], budgets[1] = None, 2  # at least one of each
    st, ids, hists = _batch(num_reqs, k, markers, budgets, seed)
    vocab = [0, 0, 0, 2, 4, 7] + list(set(markers[0] + markers[1] + markers[2]))
    d = torch.device(DEVICE)
    bad, fixed = [], 0
    for step in range(steps):
        how = CORRUPT[step % len(CORRUPT)]
        rows = [[rng.choice(vocab) for _ in range(k + 1)] for _ in range(num_reqs)]
        ns = [rng.randint(1, k + 1) for _ in range(num_reqs)]
        sampled = torch.tensor(rows, dtype=torch.int64, device=d)
        num_sampled = torch.tensor(ns, dtype=torch.int32, device=d)
        num_rejected = torch.tensor([k + 1 - x for x in ns], dtype=torch.int32, device=d)
        _corrupt(st, how)
        st.enforce(types.SimpleNamespace(sampled_token_ids=sampled), num_sampled, num_rejected,
                   types.SimpleNamespace(req_ids=ids))
        if d.type == "cuda":
            torch.cuda.synchronize()
        got_s, got_n = sampled.cpu().tolist(), num_sampled.cpu().tolist()
        for i in range(num_reqs):
            want = _rule_fixed(hists[i], rows[i][:ns[i]], budgets[i], m)
            got = got_s[i][:got_n[i]]
            fixed += int(want != rows[i][:ns[i]])
            if got != want:
                bad.append({"step": step, "corruption": how, "req": i, "budget": budgets[i],
                            "want": want, "got": got})
            hists[i] = hists[i] + got
    rep = st.report(max_records=0)
    return {"case": "check", "markers": [list(x) for x in markers], "steps": steps,
            "mismatches": len(bad), "first_mismatches": bad[:3],
            "tokens_replaced_by_rule": fixed, "fixed_tokens": rep["fixed_tokens"],
            "repaired_fields": rep["repaired_fields"], "lagged_rows": rep["truth_lagged_rows"]}


def _rule_fixed(hist, row, b, m):
    """The budget rule walked over ``row``: the row as it must be kept."""
    from workbook.core import budget

    if b is None:
        return list(row)
    for j, tok in enumerate(row):
        h = hist + row[:j]
        n = budget.reasoning_count(h, m)
        if n is not None and n >= b:
            f = budget.forced_token(h, m)
            if tok != f:
                return row[:j] + [f]
    return list(row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="also the exactness check under "
                    "corruption")
    ap.add_argument("--device", default="cuda", help="cpu: --check only, interpreted (smoke)")
    ap.add_argument("--steps", type=int, default=60, help="--check: steps per marker set")
    ap.add_argument("--json")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    import torch

    if DEVICE == "cpu":
        from workbook.core.config import RunConfig
        from workbook.vllm import env

        env.prepare_process(RunConfig())  # the Triton interpreter shim, before vLLM's import
    via = _triton_via_vllm_or_stub()
    res = {"benchmark": "guard_kernel", "device": torch.cuda.get_device_name(0)
           if DEVICE == "cuda" else "cpu (Triton interpreter)", "triton": via, "cases": []}
    if a.check:
        for markers in (((1,), (3,), (3,)), ((1,), (3,), (5, 6, 3)), ((1, 2), (4, 3), (4, 3))):
            r = check(markers, steps=a.steps)
            res["cases"].append(r)
            print(f"check markers={r['markers']}: {r['steps']} steps, mismatches "
                  f"{r['mismatches']}, tokens replaced {r['fixed_tokens']} (rule: "
                  f"{r['tokens_replaced_by_rule']}), fields repaired {r['repaired_fields']}, "
                  f"lagged rows {r['lagged_rows']}", flush=True)
    if DEVICE != "cuda":
        print(json.dumps(res))
        return
    for num_reqs, k in ((1, 4), (8, 4), (64, 4), (256, 4), (8, 0)):
        r = kernel(num_reqs, k)
        res["cases"].append(r)
        print(f"kernel  num_reqs={num_reqs:4d} k={k}: eager {r['eager_us_per_step']:.2f} µs/step, "
              f"CUDA graph {r['graph_us_per_step']:.2f} µs/step", flush=True)
    for num_reqs, k in ((8, 4), (64, 4), (256, 4)):
        r = enforce_cost(num_reqs, k)
        res["cases"].append(r)
        print(f"enforce num_reqs={num_reqs:4d} k={k}: host {r['host_us_per_step']:.1f} µs/step, "
              f"device {r['device_us_per_step']:.1f} µs/step, lagged rows {r['lagged_rows']}",
              flush=True)
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
