"""What the budget guard (``workbook.hooks.guard``) costs per engine step, on CPU or CUDA.

One engine, one process. After a warm-up, ``--rounds`` rounds each send the same batch of
requests (the reported request, ``--num-reqs`` copies, budget ``--budget`` so the guard's kernel
runs every step) once with the guard and once without, the order alternating per round so
drift (other load, clocks) hits both sides alike. Reported:

- step time with / without the guard (generate wall time / engine steps, median over rounds)
  and their ratio;
- the guard's own time per step: on CUDA, CUDA events around the wrapper's added work (the
  kernel) plus the host time of that work (launch overhead); on CPU, wall time of the same work
  (the kernel runs in Triton's interpreter there, so CPU numbers say little about a GPU). The
  take-back's redraw under speculative decoding (``--temperature`` > 0 with ``--seed``:
  ``guard_redraw`` runs vLLM's rejection sample a second time inside vLLM's ``sample``) is in
  the step-time ratio only.

Usage:
    python benchmarks/guard_overhead.py [--spec-method mtp] [--num-reqs 8] [--max-tokens 64]
        [--rounds 6] [--budget 32] [--model tiny-mimo-mtp] [--temperature 0.8 --seed 1]
        [--json out.json]
On a CPU the script sets ``WORKBOOK_TRITON_CPU=1`` itself (``workbook.vllm.engine.start`` applies the
shim in-process). Nothing here assumes a CPU: on a GPU it uses CUDA events and a 1 GiB KV cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-mimo-mtp")
    p.add_argument("--spec-method", default="mtp")
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument("--num-reqs", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=32, help="thinking_token_budget of every request")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--accept-drafts", action="store_true",
                   help="zero the lm_head (as check B does) so drafts are accepted and the guard "
                        "walks k+1 tokens per request and step")
    p.add_argument("--temperature", type=float, default=None,
                   help="sample at this temperature (default: the configuration's greedy)")
    p.add_argument("--seed", type=int, default=None,
                   help="a request seed: with --temperature > 0 under speculative decoding the "
                        "guard redraws every step's rejection sample (guard_redraw) — its cost")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


class _StepCount:
    """Counts engine steps (calls of ``GPUModelRunner.sample``) without touching the device."""

    def __init__(self):
        from workbook.vllm import hookpoints
        from workbook.vllm.patching import PatchSet

        self.n = 0
        self._ps = PatchSet("bench:steps", layer="trace")
        self._ps.wrap(hookpoints.resolve().runner, "sample", self._make)

    def _make(self, orig):
        def sample(runner, *a, **k):
            self.n += 1
            return orig(runner, *a, **k)

        return sample

    def install(self):
        self._ps.install()
        return self

    def remove(self):
        self._ps.remove()


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


def main(argv=None) -> dict:
    args = parse_args(argv)
    from workbook.core.config import RunConfig
    from workbook.hooks import guard
    from workbook.run import request
    from workbook.vllm import engine as wb_engine
    from workbook.vllm import env as wb_env

    on_cpu = wb_env.on_cpu()
    cfg = RunConfig(model=args.model, spec_method=args.spec_method,
                    num_spec_tokens=args.num_spec_tokens, max_num_seqs=max(args.num_reqs, 1),
                    enforce_eager=args.enforce_eager,
                    kv_cache_bytes=(64 << 20) if on_cpu else (1 << 30),
                    max_model_len=max(1024, 2 * args.max_tokens + 64))
    eng = wb_engine.start(cfg)
    runner = eng.runner
    dev = runner.device.type
    print("ENGINE " + json.dumps({k: eng.effective.get(k) for k in (
        "vllm_version", "runner_class", "speculator_class", "attention_backends",
        "thinking_budget_enabled")} | {"start_s": eng.timings}), flush=True)
    prompt = request.prompt_ids(eng.tokenizer, cfg)
    extra = {k: v for k, v in (("temperature", args.temperature), ("seed", args.seed))
             if v is not None}
    params = request.sampling_params(cfg, budget=args.budget, max_tokens=args.max_tokens,
                                      **extra)

    def one_round(with_guard: bool) -> tuple[float, int]:
        if with_guard:
            guard.install()
        counter = _StepCount().install()
        try:
            _sync(dev)
            t0 = time.perf_counter()
            request.generate(eng, [prompt] * args.num_reqs, [params] * args.num_reqs)
            _sync(dev)
            return time.perf_counter() - t0, counter.n
        finally:
            counter.remove()
            guard.remove()

    ctx = request.zeroed_lm_head(eng) if args.accept_drafts else contextlib.nullcontext()
    with ctx:
        rows = _measure(args, runner, one_round, guard)
    summary = _report(args, eng, rows)
    eng.shutdown()
    return summary


def _measure(args, runner, one_round, guard) -> list[dict]:
    one_round(True)  # warm-up: compile / first launches on both paths
    one_round(False)
    st = guard.state(runner)
    dev = runner.device.type
    rows = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for with_guard in order:
            if with_guard and st is not None:
                st.profile = []
            secs, steps = one_round(with_guard)
            rec = {"round": r, "guard": with_guard, "seconds": secs, "steps": steps,
                   "ms_per_step": 1e3 * secs / max(steps, 1)}
            if with_guard and st is not None:
                rec.update(_guard_time(st.profile, dev))
                st.profile = None
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    return rows


def _report(args, eng, rows) -> dict:
    dev = eng.runner.device.type
    on = [r["ms_per_step"] for r in rows if r["guard"]]
    off = [r["ms_per_step"] for r in rows if not r["guard"]]
    guard_us = [r["guard_us_per_step"] for r in rows if r.get("guard_us_per_step") is not None]
    host_us = [r["guard_host_us_per_step"] for r in rows if r.get("guard_host_us_per_step")
               is not None]
    summary = {
        "device": _device_name(dev), "vllm": eng.effective.get("vllm_version"),
        "spec_method": args.spec_method, "num_reqs": args.num_reqs,
        "accept_drafts": args.accept_drafts, "temperature": args.temperature,
        "seed": args.seed,
        "batch_tokens_per_step": statistics.median(args.num_reqs * args.max_tokens / max(r["steps"], 1)
                                             for r in rows),
        "max_tokens": args.max_tokens, "budget": args.budget, "rounds": args.rounds,
        "ms_per_step_guard": statistics.median(on), "ms_per_step_no_guard": statistics.median(off),
        "ratio_guard_over_no_guard": statistics.median(on) / statistics.median(off),
        "guard_us_per_step": statistics.median(guard_us) if guard_us else None,
        "guard_host_us_per_step": statistics.median(host_us) if host_us else None,
        "guard_fraction_of_step": (statistics.median(guard_us) / 1e3 / statistics.median(on)
                                   if guard_us else None),
    }
    print("SUMMARY " + json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rounds": rows}, f, indent=1)
    return summary


def _guard_time(profile: list, dev: str) -> dict:
    """Median µs of the guard's own work per guarded step (device time on CUDA)."""
    if not profile:
        return {"guard_steps": 0, "guard_us_per_step": None, "guard_host_us_per_step": None}
    host = [p[3] * 1e6 for p in profile]
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()
        device_us = [p[1].elapsed_time(p[2]) * 1e3 for p in profile]
    else:
        device_us = host
    return {"guard_steps": len(profile), "guard_us_per_step": statistics.median(device_us),
            "guard_host_us_per_step": statistics.median(host)}


def _device_name(dev: str) -> str:
    if dev == "cuda":
        import torch

        return torch.cuda.get_device_name()
    import platform

    return f"cpu ({platform.machine()}, Triton interpreter)"


if __name__ == "__main__":
    main()
