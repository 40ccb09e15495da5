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
# # 06 — Constraints: does every sampling constraint hold at every row under speculation?
#
# The thinking budget is one contract among several (`workbook.core.contracts`): for
# `min_tokens`, `logit_bias`, `allowed_token_ids`, `bad_words`, the penalties, stop / EOS /
# `max_tokens`, logprobs, structured outputs and the budget, the contract says what the
# processed logits of each row must hold at the columns it names (as a function of the raw
# value, the committed history and the row's drafts) and what the emitted tokens must satisfy;
# stop strings and prompt logprobs are judged on the host (nothing returned past the token that
# completed a stop string; each prompt logprob its own row's and equal to speculation off's).
# The row check (`workbook.hooks.observe.rowcheck`) keeps only those columns of every logits row — draft
# rows included — before and after `Sampler.apply_sampling_params`, with device indices only
# (no synchronization inside a step), and judges them after the run. The output check judges
# what the user got; the differential compares the same greedy request with speculation off.
# A violation is located to its step and row, with the stage the evidence shows — from the one
# list of MRV2 stages the thinking budget's diagnosis uses too (`workbook.core.stages`:
# registration, gate, device state, apply, apply on draft rows, grammar bitmask, sampling,
# acceptance, logprob row selection, prompt row selection, host-side post-processing; or
# "differential vs none" where only speculation off's output showed it) — in the one verdict
# record (`workbook.run.verdicts.Verdict`). A request whose rows carried another request's
# constraint is not violated: the touch is attributed to that request (`affected_by`). A
# constraint vLLM refuses with a method is reported with vLLM's own message.

# %% tags=["parameters"]
method: str = "mtp"  # speculative method judged against none: none | mtp | eagle | ngram | draft_model
constraint: str = "all"  # one of workbook.run.constraints.cases.CONSTRAINTS, or all
batches: list = ["single", "mixed", "mixed-natural", "mixed-scaled"]  # single | mixed | mixed-natural | mixed-scaled
constraint_fault: str = "none"  # inject one fault of workbook.hooks.faults.constraints (none: healthy vLLM)
num_spec_tokens: int = 3  # draft tokens per step (k)
outdir: str = ""  # folder for grid.json and the row evidence (empty: a temporary folder)

# %%
import json
import os
import tempfile

from IPython.display import HTML, Markdown, display

from workbook.report import constraints as section
from workbook.report import views
from workbook.run.constraints import cases as grid_run
from workbook.run.constraints import grid as study
from workbook.run import verdicts

chosen = list(grid_run.CONSTRAINTS) if constraint == "all" else [constraint]
methods = ["none"] if method == "none" else ["none", method]
out = outdir or tempfile.mkdtemp(prefix="workbook-constraints-")
# engines from environments/constraints.yaml's defaults (workbook.run.constraints.grid), as `workbook run
# constraints` runs them; with a constraint fault the reference (none) runs without it
grid = study.run(methods, chosen, out=out, batches=batches, k=num_spec_tokens,
                 fault=None if constraint_fault == "none" else constraint_fault)
print(f"grid and row evidence: {out}")

# %% [markdown]
# ## The grid
#
# Constraints down, method × batch across. ✓: every row (draft rows included) and the output
# satisfy the contract — the cell says how many rows were checked and how many drafts were
# accepted; ✗: the first violating step and row, its contract and stage; *refused*: vLLM rejected
# the parameter for that method, with its message; *method refused*: vLLM rejected the
# speculative method itself when the engine was configured, with its message.

# %%
display(HTML(section.section_html([grid])))

# %% [markdown]
# ## Violations: where the first one sits, and a reproducer

# %%
violated = [c for c in grid["cells"] if c["status"] == "violated"]
if not violated:
    display(Markdown(f"No violation: {section.summary(grid)}"))
for c in violated[:12]:
    display(Markdown(f"{verdicts.verdict_text(section.verdict_of(c))}. Output: `{c['output']}` "
                     f"({c['finish_reason']})."))
    print(grid_run.reproducer(c, grid))

# %% [markdown]
# ## Attribution: a neighbour's constraint on a request's rows
#
# In a mixed batch, a row of request B whose changed columns are exactly what another request
# A's contract gives there is A's constraint leaking: a breach of A's contract, and B — whose
# own contracts held — keeps it as `affected_by`. One row per touch (empty: no request's rows
# carried another's constraint).

# %%
touched = section.affected_rows(grid)
display(Markdown(f"{len(touched)} touch(es) by a neighbour's constraint."))
views.table(touched, "No request's rows carried another request's constraint.")

# %% [markdown]
# ## Differential: the same greedy request with speculation off
#
# Where a spec run's output differs from `none`'s, the first divergent output index, the spec
# run's step and row there, and that row's top-1 / top-2 margin (a near tie is numerics, not a
# constraint).

# %%
diffs = [c for c in grid["cells"] if c.get("differential")]
same = sum(1 for c in diffs if c["differential"].get("identical"))
display(Markdown(f"{same} of {len(diffs)} spec cells emit exactly what `none` emits."))
for c in diffs:
    d = c["differential"]
    if not d.get("identical"):
        print(f"{c['constraint']:<20} {c['method']:<12} {c['batch']:<14} output index "
              f"{d.get('out_index')}: {d.get('token')} vs {d.get('reference_token')} at step "
              f"{d.get('step')}, row {d.get('row')} (margin {d.get('margin')})")

# %%
with open(os.path.join(out, "grid.json")) as f:
    assert json.load(f)["cells"] == grid["cells"]
