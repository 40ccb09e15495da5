"""The experiments of notebooks 03 and 04, over a running engine.

- ``VARIANTS`` / ``run_variants(base)``: the decisive A/B checks the report implies (MTP on /
  off, greedy vs sampled, eager vs CUDA graphs, V2 vs V1, ngram), each a full pipeline run of
  the reported request that differs in one switch; one row per variant, and a row saying why
  for a variant the platform cannot run.
- ``before_after`` / ``checks_under_fault`` / ``identity``: the guard (``workbook.hooks.guard``)
  against each catalogue fault, guard off and on, and on healthy vLLM (token-identical).
- ``StepCounter``: per-call totals of steps, tokens kept, rejections, drafts, guard fixes.

Not here: deciding what the differences mean (the notebooks' narrative and the report).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

from workbook.core.config import RunConfig
from workbook.hooks import guard
from workbook.hooks.faults import budget as faults
from workbook.run import pipeline, request
from workbook.vllm import env, hookpoints
from workbook.vllm.patching import PatchSet

@dataclass
class StepCounter:
    """Counts, after vLLM *and* the guard (layer "trace"), steps / tokens kept / drafts.

    Syncs once per step (``.item()``): a test and notebook instrument, not for production.
    """

    steps: int = 0
    num_sampled: int = 0
    num_rejected: int = 0
    draft_tokens: int = 0
    guard_fixed: int = 0

    def __post_init__(self):
        self._ps = PatchSet("demo:step-counter", layer="trace")
        self._ps.wrap(hookpoints.resolve().runner, "sample", self._make)

    def _make(self, orig):
        counter = self

        def sample(runner, hidden_states, input_batch, *a, **k):
            out = orig(runner, hidden_states, input_batch, *a, **k)
            _so, num_sampled, num_rejected = out
            counter.steps += 1
            counter.num_sampled += int(num_sampled.sum().item())
            counter.num_rejected += int(num_rejected.sum().item())
            counter.draft_tokens += int(input_batch.num_draft_tokens)
            st = runner.__dict__.get("_workbook_guard")
            if st is not None:
                counter.guard_fixed += int(st.last_fixed.sum().item())
            return out

        return sample

    def __enter__(self):
        self._ps.install()
        return self

    def __exit__(self, *exc):
        self._ps.remove()
        return False

    def totals(self) -> dict[str, int]:
        return {"steps": self.steps, "num_sampled": self.num_sampled,
                "num_rejected": self.num_rejected, "draft_tokens": self.draft_tokens,
                "guard_fixed": self.guard_fixed}


# ---- notebook narratives (04_fix) ------------------------------------------------------------

@contextlib.contextmanager
def any_fault(name: str | None, engine):
    if not name or name == "none":
        yield None
        return
    f = faults.inject(name, engine=engine)
    try:
        yield f
    finally:
        f.remove()


def _row(label: str, o: request.Outcome, counter: StepCounter) -> dict:
    return {"run": label, "budget": o.budget, "finish_reason": o.finish_reason,
            "completion_tokens": o.completion_tokens, "reasoning_tokens": o.reasoning_tokens,
            "content": o.content, "first_token": o.first_token,
            "first_token_text": o.first_token_text, "expected_end_index": o.expected_end_index,
            "actual_end_index": o.actual_end_index, "honored": o.honored,
            "guard_fixed": counter.guard_fixed, "token_ids": o.token_ids}


def before_after(engine, fault_name: str, budget: int, max_tokens: int) -> list[dict]:
    """The reported request under ``fault_name``: guard off, then guard on (one row each)."""
    rows = []
    with any_fault(fault_name, engine):
        for with_guard in (False, True):
            ctx = guard.enabled() if with_guard else contextlib.nullcontext()
            with ctx, StepCounter() as c:
                (o,) = request.run_budgets(engine, [budget], max_tokens)
            rows.append(_row(f"{fault_name} + guard {'on' if with_guard else 'off'}", o, c))
    return rows


def checks_under_fault(engine, fault_name: str, max_tokens_b: int = 12) -> list[dict]:
    """Checks A (batched) and B (batched) under the fault, guard off and on."""
    rows = []
    with any_fault(fault_name, engine):
        for with_guard in (False, True):
            ctx = guard.enabled() if with_guard else contextlib.nullcontext()
            with ctx, StepCounter() as c:
                a = request.check_a(engine)
                b = request.check_b(engine, max_tokens=max_tokens_b)
            rows.append({"fault": fault_name, "guard": with_guard,
                         "A_exact": request.check_ok("A", a),
                         "B_exact": request.check_ok("B", b), "A_first_tokens": [o.first_token for o in a],
                         "B_end_index": [o.actual_end_index for o in b],
                         "B_expected": [o.expected_end_index for o in b],
                         "guard_fixed": c.guard_fixed})
    return rows


def identity(engine, budgets: Sequence[int | None], max_tokens: int) -> dict:
    """Healthy vLLM: the same batch with the guard off and on; tokens and step counters."""
    with StepCounter() as off:
        outs_off = request.run_budgets(engine, budgets, max_tokens)
    with guard.enabled(), StepCounter() as on:
        outs_on = request.run_budgets(engine, budgets, max_tokens)
    rows = [{"budget": b, "identical": x.token_ids == y.token_ids, "honored_off": x.honored,
             "honored_on": y.honored, "tokens_off": x.token_ids, "tokens_on": y.token_ids}
            for b, x, y in zip(budgets, outs_off, outs_on)]
    return {"rows": rows, "counters_off": off.totals(), "counters_on": on.totals(),
            "identical": all(r["identical"] for r in rows)
            and {k: v for k, v in off.totals().items() if k != "guard_fixed"}
            == {k: v for k, v in on.totals().items() if k != "guard_fixed"}}


# ---- the decisive A/B checks (03_diagnose) ---------------------------------------------------

VARIANTS: dict[str, dict] = {
    "MTP on (reported)": {},
    "MTP off": {"spec_method": "none"},
    "sampled (T=0.7, top_p=0.95)": {"temperature": 0.7, "top_p": 0.95},
    "CUDA graphs (enforce_eager=False)": {"enforce_eager": False},
    "runner V1 (VLLM_USE_V2_MODEL_RUNNER=0)": {"runner": "v1"},
    "ngram": {"spec_method": "ngram"},
}


def applicable(cfg: RunConfig, on_cpu: bool) -> str | None:
    """Why a variant cannot run here, or None."""
    if on_cpu and not cfg.enforce_eager:
        return "CUDA graphs need a GPU (the CPU platform runs eager)"
    return None


def run_variants(base: RunConfig, names: list[str] | None = None):
    import pandas as pd

    rows = []
    cpu = env.on_cpu()
    for name in names or list(VARIANTS):
        cfg = base.replace(**VARIANTS[name])
        why = applicable(cfg, cpu)
        if why:
            rows.append({"variant": name, "verdict": "not run", "summary": why})
            continue
        try:
            res = pipeline.run(cfg)
        except Exception as e:  # a variant that fails is a finding, keep going
            rows.append({"variant": name, "verdict": "error",
                         "summary": f"{type(e).__name__}: {e}"[:300]})
            continue
        o, v, eff = res.outcome, res.verdict, res.effective
        rows.append({"variant": name, "verdict": v["verdict"], "hypothesis": v["hypothesis"],
                     "first_token": o.first_token_text, "expected_end_index":
                     o.expected_end_index, "actual_end_index": o.actual_end_index,
                     "reasoning_tokens": o.reasoning_tokens,
                     "completion_tokens": o.completion_tokens,
                     "runner": (eff.get("runner_class") or "").rsplit(".", 1)[-1],
                     "runner_is_v2": eff.get("runner_is_v2"),
                     "speculator": (eff.get("speculator_class") or "—").rsplit(".", 1)[-1],
                     "summary": v["summary"]})
    return pd.DataFrame(rows)
