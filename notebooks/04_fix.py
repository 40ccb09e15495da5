# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python (workbook)
#     language: python
#     name: workbook
# ---

# %% [markdown]
# # 04 — The fix: a commit-time budget guard for MRV2
#
# vLLM enforces `thinking_token_budget` *before* sampling (a 1e9 logit on `</think>`); #54906
# shows that something between that write and the committed token can lose it. The guard
# (`workbook.hooks.guard`) checks the *result* instead: after `GPUModelRunner.sample` returned the
# step's tokens — whichever sampler produced them, with or without drafts — and before they are
# committed, one Triton kernel walks each request's tokens with vLLM's own budget semantics and,
# where the budget binds and the token is not the due end marker, writes it and truncates the
# step there (as a rejected draft would). It keeps its own per-request state and never reads
# vLLM's `ThinkingBudgetState`.
#
# Below: (1) the reported request on a vLLM made to ignore the budget (a fault of the
# catalogue, `workbook.hooks.faults.budget`) — guard off: violated, guard on: honoured; (2) checks A
# and B under the same fault; (3) on healthy vLLM, guard on and off give identical tokens and
# identical step / acceptance counters; (4) the reported request with fault and guard through
# the pipeline, whose evidence files the report reads. All logic lives in
# `workbook.run.budget.experiments`; the upstream version of the fix is in `upstream/`.

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # built-in model (workbook.core.models.names()) or a checkpoint folder
draft_model: str = None  # eagle / draft_model speculation: draft path or tiny name (None: default)
spec_method: str = "mtp"  # mtp | eagle | eagle3 | ngram | draft_model | none
num_spec_tokens: int = 4  # draft tokens per step (k)
max_num_seqs: int = 16  # engine batch size (the identity batch is sent at once)
kv_cache_bytes: int = 67108864  # KV cache size in bytes (None: gpu_memory_utilization decides)
fault: str = "H-b"  # how vLLM is made to ignore the budget: a runtime fault of workbook.hooks.faults.budget, or none
thinking_token_budget: int = 1  # budget of the reported request
max_tokens: int = 32  # completion length of the reported request
identity_budgets: list = [None, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # healthy on/off comparison (None: no budget)
identity_max_tokens: int = 16  # completion length in the identity comparison
outdir: str = ""  # folder for JSON evidence (empty: keep in memory only)

# %% [markdown]
# ## Engine
# One in-process engine (MRV2) serves every section: faults and the guard are installed and
# removed at run time.

# %%
import json
import os

import pandas as pd
from IPython.display import Markdown, display

from workbook.core import hypotheses
from workbook.core.config import ConfigError, RunConfig
from workbook.hooks import guard as guard_hook
from workbook.report import views
from workbook.run import pipeline
from workbook.run.budget import experiments

if fault != "none" and fault not in hypotheses.runtime_faults():
    raise ConfigError(f"fault={fault!r}: choose none or a runtime fault, one of "
                      f"{hypotheses.runtime_faults()} (H-h is a V1 run: no MRV2 to guard)")
cfg = RunConfig.from_params({**globals(), "fault": "none", "trace": False})
session = pipeline.Run(cfg).start()  # the pipeline's engine, no hooks: sections add their own
eng = session.result.engine
eff = {k: eng.effective.get(k) for k in ("vllm_version", "runner_class", "runner_is_v2",
                                          "speculator_class", "spec_method", "num_spec_tokens",
                                          "thinking_budget_enabled", "reasoning_start_token_ids",
                                          "reasoning_end_token_ids",
                                          "natural_reasoning_end_token_ids")}
views.values_table(eff, "effective")

# %% [markdown]
# ## 1. The reported request, vLLM broken on purpose
# `fault` makes vLLM ignore the budget (its description below). Guard off: the budget is
# violated as in the report (no `</think>` where it is due). Guard on: `</think>` exactly where
# the budget puts it; `guard_fixed` counts the tokens the guard replaced.

# %%
desc = (hypotheses.FAULTS[fault].description if fault != "none"
        else "none: healthy vLLM (both rows should honour the budget)")
display(Markdown(f"**fault `{fault}`**: {desc}"))
before_after = experiments.before_after(eng, fault, thinking_token_budget, max_tokens)
views.readable(pd.DataFrame(before_after).set_index("run").T)

# %% [markdown]
# ## 2. Checks A and B under the same fault
# A: budgets 1 and 0 → `</think>` first. B: `lm_head` zeroed so drafts are accepted; budgets
# 2..9 → `</think>` exactly at the budget (every offset of the draft window). Each check is one
# batch; guard off, then on.

# %%
checks = experiments.checks_under_fault(eng, fault)
views.readable(pd.DataFrame(checks))

# %% [markdown]
# ## 3. Healthy vLLM: the guard changes nothing
# The same batch (one request per budget; "no budget": a request without one) without and
# with the guard:
# identical tokens, identical engine steps, tokens kept, rejections and draft counts, and
# `guard_fixed == 0` (vLLM's own forcing already did the job).

# %%
ident = experiments.identity(eng, identity_budgets, identity_max_tokens)
same = sum(bool(r["identical"]) for r in ident["rows"])
display(Markdown(f"**Guard on vs off: {same} of {len(ident['rows'])} requests token-identical"
                 f"{'' if ident['identical'] else ' — NOT identical'}.**"))
pd.DataFrame({"guard off": ident["counters_off"], "guard on": ident["counters_on"]})

# %%
views.readable(pd.DataFrame(ident["rows"]))

# %% [markdown]
# ## 4. Through the pipeline: the reported request with the fault and the guard
# The same evidence files as every run (`verdict.json`, the trace, ...), for the report.

# %%
session.finish()
fixed = pipeline.run(cfg.replace(fault=fault, guard=True, trace=True), outdir or None)
display(views.verdict_markdown(fixed.verdict, ""))

# %% [markdown]
# What the guard did in that run (`verdict["guard"]`): the tokens it replaced, and every field
# of its own device state (budget, count, tail, kept in three replicas) that it found differing
# from the host's truth and repaired — each repair one row of the trace's `guard` table.

# %%
display(Markdown(f"**{views.guard_sentence(fixed.verdict)}.**"))
views.table(views.guard_repairs(fixed.verdict, fixed.frames),
            "No repair of the guard's own state is recorded for this run (the sentence "
            "above says why).")

# %% [markdown]
# ## Verdict

# %%
violated_off = before_after[0]["honored"] is False
honored_on = before_after[1]["honored"] is True
checks_on = all(r["A_exact"] and r["B_exact"] for r in checks if r["guard"])
summary = {"fault": fault, "violated_without_guard": violated_off,
           "pipeline_verdict_with_guard": fixed.verdict["verdict"],
           "honored_with_guard": honored_on, "checks_exact_with_guard": checks_on,
           "identical_on_healthy_vllm": ident["identical"],
           "guard_fixed_tokens": (fixed.verdict.get("guard") or {}).get("fixed_tokens"),
           "guard_repaired_fields": (fixed.verdict.get("guard") or {}).get("repaired_fields"),
           "guard_patch_set": guard_hook.patch_set().name, "guard_installed_now": guard_hook.installed()}
shown = (violated_off or fault == "none") and honored_on and checks_on and ident["identical"]
display(Markdown("**The guard restores the budget and is invisible on healthy vLLM.**"
                 if shown else "**Not shown** — see the tables above."))
if outdir:
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "fix.json"), "w") as f:
        json.dump({"summary": summary, "before_after": before_after, "checks": checks,
                   "identity": ident, "effective": eff}, f, indent=1, default=str)
views.values_table(summary)
