# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python (workbook)
#     language: python
#     name: workbook
# ---

# %% [markdown]
# # 03 — Diagnose: where is the budget lost?
#
# The reported request, traced and diagnosed by `workbook.run.diagnose` (rules over the trace,
# written from first principles; it never reads which fault, if any, was injected), then the
# decisive A/B checks the report implies — MTP on/off, greedy vs sampled, eager vs CUDA graphs,
# V2 vs V1, ngram — side by side in one table.

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # built-in model (workbook.core.models.names()) or a checkpoint folder
spec_method: str = "mtp"  # none | mtp | eagle | eagle3 | ngram | draft_model
num_spec_tokens: int = 4  # draft tokens per step (k)
runner: str = "v2"  # v2 | v1 | auto
enforce_eager: bool = True  # False: CUDA graphs (GPU only)
attention_backend: str = None  # None: vLLM's pick
kv_cache_bytes: int = 67108864  # KV cache size in bytes
engine_kwargs: dict = {}  # extra keyword arguments for vllm.LLM
thinking_token_budget: int = 1  # reasoning-token budget (-1: none)
max_tokens: int = 32  # completion length limit
fault: str = "none"  # inject one hypothesis' fault (workbook.hooks.faults), e.g. H-b
guard: bool = False  # apply the commit-time budget guard (workbook.hooks.guard)
variants: list = []  # A/B variants to run: names of workbook.run.experiments.VARIANTS (empty: all)
outdir: str = ""  # folder for the evidence files (empty: memory only)

# %%
import os

import pandas as pd
from IPython.display import Markdown, display

from workbook.core import hypotheses
from workbook.core.config import RunConfig
from workbook.run import experiments, pipeline

cfg = RunConfig.from_params(globals())

# %% [markdown]
# ## The reported request: verdict and evidence

# %%
res = pipeline.run(cfg, outdir or None)
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
# ## The hypotheses
# The catalogue (`workbook.core.hypotheses`): the stage each lives in, the evidence that
# confirms it in the trace, and the A/B check that separates it from the others.

# %%
pd.DataFrame(hypotheses.table())

# %% [markdown]
# ## Decisive A/B checks
# Each row is the reported request with one switch flipped, traced and diagnosed on its own
# engine. On the reporter's Thor: MTP on → violated; MTP off → honored; ngram "worked" on V1.

# %%
ab = experiments.run_variants(cfg, variants or None)
if outdir:
    ab.to_csv(os.path.join(outdir, "ab_checks.csv"), index=False)
ab
