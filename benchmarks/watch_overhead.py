"""What the start-up watch (``workbook.hooks.watch``) costs per engine step after start-up.

One engine, one process, side by side: the engine is started with the watch in place (no
localization), then ``--rounds`` rounds each send the same batch (the reported request,
``--num-reqs`` copies, budget ``--budget`` so the budget state is live every step) once with the
watch's wrappers installed and once with them taken out (``watch.suspend()`` / ``resume()``),
the order alternating per round. Reported: step time watched / unwatched (generate wall time /
engine steps, median over rounds), their ratio, and the watch's own time per step (its
per-step ring records and the flushes, from its counters). The issue's bound: at most 1 % of
step time after start-up.

    python benchmarks/watch_overhead.py [--model tiny-mimo-mtp] [--num-reqs 8] [--max-tokens 64]
        [--rounds 6] [--json out.json] [--set KEY=VALUE ...]

On a GPU (e.g. the H200 with ``--set model=tiny-qwen3.5-mtp --set kv_cache_bytes=1073741824
--set engine_kwargs='{gdn_prefill_backend: triton}'``) the ring records are device copies with no
host sync, so the ratio there is the one the bound is about; on CPU everything is synchronous.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-mimo-mtp")
    p.add_argument("--num-reqs", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="RunConfig field KEY=VALUE (YAML value)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


class _Steps:
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

    def __enter__(self):
        self._ps.install()
        return self

    def __exit__(self, *exc):
        self._ps.remove()


def main(argv=None) -> dict:
    import yaml

    a = parse_args(argv)
    from workbook.core.config import RunConfig
    from workbook.hooks import watch
    from workbook.run import backends, request
    from workbook.vllm import env

    over = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.overrides)}
    cfg = RunConfig(model=a.model, watch=True, trace=False, **over)
    if env.on_cpu() is False and cfg.kv_cache_bytes == RunConfig().kv_cache_bytes:
        cfg = cfg.replace(kv_cache_bytes=1 << 30)
    own, _ = backends.own_engine(cfg)
    eng, w = own.engine, own.watch
    budgets = [a.budget] * a.num_reqs

    def one(watched: bool) -> tuple[float, int, float]:
        (watch.resume if watched else watch.suspend)()
        s0 = w.check_s["steps"]
        with _Steps() as st:
            t = time.perf_counter()
            request.run_budgets(eng, budgets, a.max_tokens)
            dt = time.perf_counter() - t
        if watched:
            w.flush()  # the ring's analysis belongs to the watched side
        return dt, st.n, w.check_s["steps"] - s0

    one(True)
    one(False)  # warm-up both paths
    rows = []
    for r in range(a.rounds):
        for watched in ((True, False) if r % 2 == 0 else (False, True)):
            dt, n, own_s = one(watched)
            rows.append({"round": r, "watched": watched, "seconds": dt, "steps": n,
                         "step_ms": 1e3 * dt / max(n, 1),
                         "watch_ms_per_step": 1e3 * own_s / max(n, 1)})
    watch.resume()
    on = [x["step_ms"] for x in rows if x["watched"]]
    off = [x["step_ms"] for x in rows if not x["watched"]]
    per = statistics.median(x["watch_ms_per_step"] for x in rows if x["watched"])
    data = w.read()
    res = {"benchmark": "watch_overhead", "platform": data.get("platform"),
           "device": data.get("device"), "vllm": data.get("vllm_version"),
           "model": cfg.model, "num_reqs": a.num_reqs, "max_tokens": a.max_tokens,
           "rounds": a.rounds, "step_ms_watched": round(statistics.median(on), 3),
           "step_ms_unwatched": round(statistics.median(off), 3),
           "ratio": round(statistics.median(on) / statistics.median(off), 4),
           "watch_own_ms_per_step": round(per, 4),
           "watch_own_fraction": round(per / statistics.median(on), 5),
           "unexpected_changes": data.get("n_changes"), "rows": rows}
    print(f"step time watched {res['step_ms_watched']:.2f} ms | unwatched "
          f"{res['step_ms_unwatched']:.2f} ms | ratio {res['ratio']:.4f} | watch's own time "
          f"{res['watch_own_ms_per_step']:.3f} ms/step ({100 * res['watch_own_fraction']:.2f} %)"
          f" | {res['platform']} {res['device']} vLLM {res['vllm']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
