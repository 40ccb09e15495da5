# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — Diagnose: where is the budget lost?
#
# The reported request, traced and diagnosed by `workbook.diagnose` (rules over the trace,
# written from first principles; it never reads which fault, if any, was injected), then the
# decisive A/B checks the report implies — MTP on/off, greedy vs sampled, eager vs CUDA graphs,
# V2 vs V1, ngram — side by side in one table.

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # tiny model name (workbook.models.MODELS) or a checkpoint folder
spec_method: str = "mtp"  # none | mtp | eagle | eagle3 | ngram | draft_model
num_spec_tokens: int = 4  # draft tokens per step (k)
runner: str = "v2"  # v2 | v1 | auto
enforce_eager: bool = True  # False: CUDA graphs (GPU only)
attention_backend: str = None  # None: vLLM's pick
kv_cache_bytes: int = 67108864  # KV cache size in bytes
engine_kwargs: dict = {}  # extra keyword arguments for vllm.LLM
thinking_token_budget: int = 1  # reasoning-token budget (-1: none)
max_tokens: int = 32  # completion length limit
fault: str = "none"  # inject one hypothesis' fault (workbook.faults), e.g. H-b
guard: bool = False  # apply the commit-time budget guard (workbook.guard)
variants: list = []  # A/B variants to run (names of workbook.abtests.VARIANTS; [] = all)
outdir: str = ""  # folder for the evidence files (empty: memory only)

# %%
import dataclasses
import os

import pandas as pd
from IPython.display import Markdown, display

from workbook import abtests, diagnose, investigate
from workbook.config import RunConfig, validate

params = {f.name: globals()[f.name] for f in dataclasses.fields(RunConfig) if f.name in globals()}
cfg = validate(RunConfig.from_dict(params))

# %% [markdown]
# ## The reported request: verdict and evidence

# %%
res = investigate.run(cfg, outdir or None)
v = res.verdict
display(Markdown(f"### {v['verdict']} — hypothesis `{v['hypothesis']}`"
                 f"{' (' + v['hypothesis_title'] + ')' if v['hypothesis_title'] else ''}\n\n"
                 f"{v['summary']}"))
pd.DataFrame([v["first_violation"] or {}])

# %% [markdown]
# Evidence rows: the request-step and the logits row at the violation (empty when honored).

# %%
pd.DataFrame(v["evidence"] or [])

# %% [markdown]
# ## The rules
# Evaluated in pipeline order on the violating request-step and row; the first that fires is
# the stage where the budget was lost.

# %%
pd.DataFrame({"hypothesis": list(diagnose.TITLES), "meaning": list(diagnose.TITLES.values())})

# %% [markdown]
# ## Decisive A/B checks
# Each row is the reported request with one switch flipped, traced and diagnosed on its own
# engine. On the reporter's Thor: MTP on → violated; MTP off → honored; ngram "worked" on V1.

# %%
ab = abtests.run_variants(cfg, variants or None)
if outdir:
    ab.to_csv(os.path.join(outdir, "ab_checks.csv"), index=False)
ab
