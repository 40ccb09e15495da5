"""The decisive A/B checks the report implies, side by side in one table.

The reporter saw: MTP on → budget ignored; MTP off → honored; ngram "works" but silently ran
on V1. ``VARIANTS`` turns each of those observations into a pair of runs of the reported
request that differ in one switch (MTP, sampling, CUDA graphs, runner), each traced and
diagnosed. ``run_variants(base)`` returns one row per variant; a variant the platform cannot
run (CUDA graphs on a CPU) is a row saying so, not a silent gap.

Not here: deciding what the differences mean (the notebook's narrative and the report do).
"""

from __future__ import annotations

import pandas as pd

from workbook.config import RunConfig

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


def run_variants(base: RunConfig, names: list[str] | None = None) -> pd.DataFrame:
    from workbook import engine, investigate

    rows = []
    cpu = engine.on_cpu()
    for name in names or list(VARIANTS):
        cfg = base.replace(**VARIANTS[name])
        why = applicable(cfg, cpu)
        if why:
            rows.append({"variant": name, "verdict": "not run", "summary": why})
            continue
        try:
            res = investigate.run(cfg)
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
