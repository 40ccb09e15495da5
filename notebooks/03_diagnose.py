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
# # 03 — Diagnose: why was the budget lost?
#
# The reported request, traced and diagnosed by `workbook.run.budget.diagnose`. Each stage of Model
# Runner V2 has a contract (registration sets the budget, the gate lets the slot through, apply
# launches, the kernel writes +1e9 into exactly the due `</think>` column of exactly the rows
# whose reasoning count reached the budget, the device state it reads equals the host truth, the
# sampler samples the biased tensor, the rejection sampler accepts no draft past a forced row,
# the committed token is the sampled one). The tracer reads the live objects; the host truth of
# every row comes from the committed history and the reasoning configuration alone. A cause is
# named only from positive evidence at the violating row: several fitting causes are all listed,
# none fitting is "unclassified" with the strongest anomalies. With `probes=True` the checks
# that separate the remaining causes (batch of 1, markers re-uploaded, device state refreshed,
# guard on, MTP off ...) are run and fed back. The rules never read which fault, if any, was
# injected.

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
fault: str = "none"  # inject one hypothesis' fault (workbook.hooks.faults.budget), e.g. H-i
guard: bool = False  # apply the commit-time budget guard (workbook.hooks.guard)
zero_lm_head: bool = False  # zero the target lm_head so drafts are accepted (in-process only)
probes: bool = True  # after a violation, run the probes that confirm its cause (in-process)
variants: list = []  # A/B variants to run: names of workbook.run.budget.experiments.VARIANTS (empty: all)
outdir: str = ""  # folder for the evidence files (empty: memory only)

# %%
import os

import pandas as pd
from IPython.display import display

from workbook.core import hypotheses
from workbook.core.config import RunConfig
from workbook.report import views, wording
from workbook.run import pipeline
from workbook.run.budget import diagnose
from workbook.run.budget import experiments

cfg = RunConfig.from_params(globals())

# %% [markdown]
# ## The reported request: verdict and the chain behind it

# %%
res = pipeline.run(cfg, outdir or None)
v = res.verdict
display(views.verdict_markdown(v))
views.table(views.first_violation(v, views.decoder(model=cfg.model)),
            "No request was violated: there is no first violating step.")

# %% [markdown]
# The chain, one row per cause (and per candidate a probe refuted): the stage whose contract
# broke → what the trace saw there → the cause → what would confirm it → the probes' results
# (✓ as the cause predicts, ✗ against it). `diagnose.chain_rows(verdict)` builds it (the
# report shows the same rows).

# %%
views.table(diagnose.chain_rows(v), "No chain: no stage broke its contract at a violating "
            "row (nothing was violated)." if v.get("verdict") == "honored" else
            "No chain: the diagnosis named no cause for this run.",
            columns=["stage", "anomaly", "cause", "confirm", "result", "status"])

# %% [markdown]
# The probes that ran (each the violating request re-sent with one switch) and every violated
# request with its own first violation and causes; then the offset pattern (expected vs actual
# end index of every budgeted request) and the batch of the violating step.

# %%
views.table([{"probe": n, **{k: p.get(k) for k in ("switch", "ran", "verdict", "budgets",
                                                     "hypothesis", "why", "seconds")}}
             for n, p in (res.probes or {}).items()],
            "No probe ran: probes run only after a violation" + (
                "." if cfg.probes else ", with `probes=True` (off in this run)."))

# %%
views.table([{"req_id": x["req_id"], "budget": x["budget"],
              "kind": x["first_violation"].get("kind") or "missing",
              "what": wording.violation_text(x["first_violation"]),
              "step": x["first_violation"]["step"],
              "local_pos": x["first_violation"]["local_pos"],
              "hypothesis": x["hypothesis"] or "no cause named",
              "causes": [c["hypothesis"] for c in x["causes"]]}
             for x in v.get("violations") or []],
            "Every request honoured its budget: no violated request to list.")

# %%
display(views.table(views.offsets(v), "No request of this run had a budget: no offsets."))
views.table((v.get("first_violation") or {}).get("batch") or [],
            "No violating step, so no batch to show.")

# %% [markdown]
# Every contract break anywhere in the trace (empty on healthy vLLM), by stage, and the evidence
# rows at the violation: the request-step (device markers, caches before/after apply vs the
# rule, budget views, history, mapping) and the logits row (due token, bias columns, the due
# column after apply and in the tensor sampled).

# %%
display(views.table(v.get("anomalies") or [], "No contract break anywhere in the trace.",
                    columns=["stage", "check", "count", "saw", "first"]))
views.table(pd.DataFrame(v.get("evidence") or []).T, "No evidence rows: the diagnosis names "
            "no cause" + (" (nothing was violated)." if v.get("verdict") == "honored"
                          else " for this run."))

# %% [markdown]
# ## The hypotheses
# The catalogue (`workbook.core.hypotheses`): the stage each lives in, the evidence that
# confirms it in the trace, the A/B check that separates it, and what each probe must show.

# %%
pd.DataFrame([{"stage": s, "contract": c} for s, c in hypotheses.STAGES.items()])

# %%
views.readable(pd.DataFrame(hypotheses.table()))

# %% [markdown]
# ## Decisive A/B checks
# Each row is the reported request with one switch flipped, traced and diagnosed on its own
# engine. On the reporter's Thor: MTP on → violated; MTP off → honored; ngram "worked" on V1.

# %%
ab = experiments.run_variants(cfg.replace(probes=False), variants or None)
if outdir:
    ab.to_csv(os.path.join(outdir, "ab_checks.csv"), index=False)
views.readable(ab)
