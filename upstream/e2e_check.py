"""End-to-end check of the upstream patch: the patched vLLM copy (on PYTHONPATH) in a real engine.

Run by ``apply_and_test.sh`` when ``E2E=1``. Starts the tiny MTP model (k=4, MRV2), asserts the
runner built ``ThinkingBudgetGuard``, then makes vLLM ignore the budget with two faults of the
workbook's catalogue (``H-b``: ``ThinkingBudgetState`` disabled; ``H-e``: sampling from the
unprocessed logits) and checks A and B with the built-in guard only (the workbook's own guard is
NOT installed). Then a second engine starts with fault ``H-i-profile`` (vLLM #54906's finding:
the marker tensors zeroed on the device during the profiling run, storage and ``_version``
unchanged): the patched ``ThinkingBudgetState`` still forces (its kernels use compile-time marker
ids; the guard has nothing to fix) and ``check_markers()`` reports and repairs the device copies.
In every check the guard's own state must agree with its host truth (``guard_repaired`` 0).
Prints one JSON line; exits non-zero when a check fails.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    t0 = time.perf_counter()
    from workbook.core.config import RunConfig
    from workbook.run import request
    from workbook.run.budget import experiments
    from workbook.vllm import engine

    eng = engine.start(RunConfig(spec_method="mtp", num_spec_tokens=4))
    import vllm

    runner = eng.runner
    g = getattr(runner, "thinking_budget_guard", None)
    result = {"vllm": vllm.__version__, "vllm_path": os.path.dirname(vllm.__file__),
              "runner_is_v2": eng.effective["runner_is_v2"],
              "guard_built": g is not None, "guard_enabled": bool(getattr(g, "enabled", False)),
              "checks": {}}
    ok = result["runner_is_v2"] and result["guard_enabled"]
    for fault in (None, "H-b", "H-e"):
        before = int(g.num_fixed[0]) if g is not None else 0
        rep_before = int(g.num_repaired[0]) if g is not None else 0
        with experiments.any_fault(fault, eng):
            a = request.check_a(eng)
            b = request.check_b(eng, max_tokens=12)
        fixed = (int(g.num_fixed[0]) if g is not None else 0) - before
        repaired = (int(g.num_repaired[0]) if g is not None else 0) - rep_before
        rec = {"A": request.check_ok("A", a), "B": request.check_ok("B", b),
               "guard_fixed": fixed, "guard_repaired": repaired,
               "B_end_index": [o.actual_end_index for o in b]}
        result["checks"][fault or "healthy"] = rec
        # None of these faults touches the guard's own state: nothing to repair.
        ok = ok and rec["A"] and rec["B"] and (fault is None) == (fixed == 0) and \
            repaired == 0
    # vLLM #54906's finding: the budget state's marker tensors zeroed on the device during the
    # profiling run (fault H-i-profile: a raw alias write hidden in the target's first MLP).
    # The patched ThinkingBudgetState forces from compile-time marker ids (the guard has
    # nothing to fix) and check_markers() reports and repairs the device copies.
    from workbook.run import backends
    from workbook.vllm import env as wenv

    cfg = RunConfig(spec_method="mtp", num_spec_tokens=4, fault="H-i-profile",
                    cpu_profile_run=wenv.on_cpu())
    own, _ = backends.own_engine(cfg)
    eng2 = own.engine
    state = eng2.runner.sampler.thinking_budget_state
    g2 = eng2.runner.thinking_budget_guard
    zeroed = state.reasoning_start_token_ids.tolist() == [0]
    before = int(g2.num_fixed[0])
    a = request.check_a(eng2)
    b = request.check_b(eng2, max_tokens=12)
    rec = {"markers_zeroed_at_start": zeroed, "A": request.check_ok("A", a),
           "B": request.check_ok("B", b), "guard_fixed": int(g2.num_fixed[0]) - before,
           "guard_repaired": int(g2.num_repaired[0]),
           "marker_corruptions_reported": state.num_marker_corruptions,
           "markers_repaired": state.reasoning_start_token_ids.tolist() != [0]}
    result["checks"]["H-i-profile"] = rec
    ok = ok and zeroed and rec["A"] and rec["B"] and rec["guard_fixed"] == 0 and \
        rec["guard_repaired"] == 0 and \
        rec["marker_corruptions_reported"] >= 1 and rec["markers_repaired"]
    result["ok"] = bool(ok)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print("E2E " + json.dumps(result), flush=True)
    eng.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
