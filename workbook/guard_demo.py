"""Batched checks and notebook narratives that demonstrate the budget guard (``workbook.guard``).

The guard must hold however vLLM loses the forcing; the ways it can be lost are the faults of
``workbook.faults`` (one per hypothesis), injected here with ``any_fault``.

Batched checks (one ``llm.generate`` per call, so a test or notebook needs few engine steps):
``run_budgets`` (the reported request at several budgets), ``check_a_batched``,
``check_b_batched`` (same definitions as ``workbook.request.check_a`` / ``check_b``) and
``StepCounter`` (per-call totals of ``num_sampled`` / draft tokens, read after the run).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

from workbook import hookpoints, request
from workbook.patching import PatchSet

# ---- batched requests and checks -------------------------------------------------------------

def run_budgets(engine, budgets: Sequence[int | None], max_tokens: int) -> list[request.Outcome]:
    """The reported request once per budget, all in one ``generate`` call (prompt order)."""
    cfg, tok = engine.cfg, engine.tokenizer
    prompt = request.prompt_ids(tok, cfg)
    params = [request.sampling_params(cfg, budget=b, max_tokens=max_tokens) for b in budgets]
    outs = request.generate(engine, [prompt] * len(budgets), params)
    return [request.outcome_from(tok, cfg, engine.effective, out.request_id, prompt,
                                 list(out.outputs[0].token_ids), out.outputs[0].text,
                                 out.outputs[0].finish_reason, budget=b, max_tokens=max_tokens)
            for out, b in zip(outs, budgets)]


def check_a_batched(engine, budgets: Sequence[int] = (1, 0)) -> list[request.Outcome]:
    """``request.check_a`` in one batch: ``</think>`` first for budgets 1 and 0."""
    return run_budgets(engine, budgets, max_tokens=8)


def check_b_batched(engine, budgets: Sequence[int] = tuple(range(2, 10)),
                    max_tokens: int = 24) -> list[request.Outcome]:
    """``request.check_b`` in one batch (zeroed ``lm_head``, drafts accepted)."""
    with request.zeroed_lm_head(engine):
        outcomes = run_budgets(engine, budgets, max_tokens)
    for o in outcomes:
        exp = o.expected_end_index
        want = ([0] * exp + o.end_token_ids) if exp is not None else None
        o.extra["check_b_prefix_ok"] = want is not None and o.token_ids[:len(want)] == want
    return outcomes


def a_ok(outcomes) -> bool:
    return all(o.honored is True for o in outcomes)


def b_ok(outcomes) -> bool:
    return all(o.extra.get("check_b_prefix_ok") and o.honored is True for o in outcomes)


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
    from workbook import faults

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
    from workbook import guard

    rows = []
    with any_fault(fault_name, engine):
        for with_guard in (False, True):
            ctx = guard.enabled() if with_guard else contextlib.nullcontext()
            with ctx, StepCounter() as c:
                (o,) = run_budgets(engine, [budget], max_tokens)
            rows.append(_row(f"{fault_name} + guard {'on' if with_guard else 'off'}", o, c))
    return rows


def checks_under_fault(engine, fault_name: str, max_tokens_b: int = 12) -> list[dict]:
    """Checks A (batched) and B (batched) under the fault, guard off and on."""
    from workbook import guard

    rows = []
    with any_fault(fault_name, engine):
        for with_guard in (False, True):
            ctx = guard.enabled() if with_guard else contextlib.nullcontext()
            with ctx, StepCounter() as c:
                a = check_a_batched(engine)
                b = check_b_batched(engine, max_tokens=max_tokens_b)
            rows.append({"fault": fault_name, "guard": with_guard, "A_exact": a_ok(a),
                         "B_exact": b_ok(b), "A_first_tokens": [o.first_token for o in a],
                         "B_end_index": [o.actual_end_index for o in b],
                         "B_expected": [o.expected_end_index for o in b],
                         "guard_fixed": c.guard_fixed})
    return rows


def identity(engine, budgets: Sequence[int | None], max_tokens: int) -> dict:
    """Healthy vLLM: the same batch with the guard off and on; tokens and step counters."""
    from workbook import guard

    with StepCounter() as off:
        outs_off = run_budgets(engine, budgets, max_tokens)
    with guard.enabled(), StepCounter() as on:
        outs_on = run_budgets(engine, budgets, max_tokens)
    rows = [{"budget": b, "identical": x.token_ids == y.token_ids, "honored_off": x.honored,
             "honored_on": y.honored, "tokens_off": x.token_ids, "tokens_on": y.token_ids}
            for b, x, y in zip(budgets, outs_off, outs_on)]
    return {"rows": rows, "counters_off": off.totals(), "counters_on": on.totals(),
            "identical": all(r["identical"] for r in rows)
            and {k: v for k, v in off.totals().items() if k != "guard_fixed"}
            == {k: v for k, v in on.totals().items() if k != "guard_fixed"}}
