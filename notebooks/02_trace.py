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
# # 02 — The per-step story of one run
#
# What Model Runner V2 did with the thinking budget at every engine step, read from the real
# vLLM objects by the tracer (`workbook.hooks.observe.tracer`): the sampling path, the drafts, the
# `ThinkingBudgetState` flags (host and device budget, gate, fast path, kernels), and per
# logits row the logit of `</think>` before and after `ThinkingBudgetState.apply`, the token
# sampled and the token emitted. `zero_lm_head` makes target and drafter agree on token 0, so
# drafts are accepted and the budget boundary lands inside a draft window (check B's setting).
# The run itself is `workbook.run.pipeline.run`, as in every notebook.

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # built-in model (workbook.core.models.names()) or a checkpoint folder
spec_method: str = "mtp"  # none | mtp | eagle | eagle3 | ngram | draft_model
num_spec_tokens: int = 4  # draft tokens per step (k)
runner: str = "v2"  # v2 | v1 | auto
enforce_eager: bool = True  # False: CUDA graphs (GPU only)
attention_backend: str = None  # None: vLLM's pick
kv_cache_bytes: int = 67108864  # KV cache size in bytes
engine_kwargs: dict = {}  # extra keyword arguments for vllm.LLM
thinking_token_budget: int = 3  # reasoning-token budget (-1: none)
max_tokens: int = 12  # completion length limit
temperature: float = 0.0  # 0: greedy
fault: str = "none"  # inject one hypothesis' fault (workbook.hooks.faults.budget), e.g. H-d-draft
guard: bool = False  # apply the commit-time budget guard (workbook.hooks.guard)
zero_lm_head: bool = True  # zero the target lm_head so drafts are accepted (check B setting)
outdir: str = ""  # folder for the evidence files (empty: memory only)

# %%
import pandas as pd
from IPython.display import HTML, display

from workbook.core.budget import Markers
from workbook.core.config import RunConfig
from workbook.report import views
from workbook.run import pipeline

pd.set_option("display.max_columns", None)  # trace tables: every column
cfg = RunConfig.from_params(globals())
res = pipeline.run(cfg, outdir or None)  # vLLM's start-up log goes to a file (path printed)
frames, verdict = res.frames, res.verdict
END = Markers.of(res.effective).end[0]
decode = views.decoder(model=cfg.model, tokenizer=getattr(res.engine, "tokenizer", None))
display(views.verdict_markdown(verdict, ""))
print("emitted:", " ".join(views.tokens.show(decode(t)) for t in res.outcome.token_ids))

# %% [markdown]
# ## Step explorer
# Every traced request (the reported one, then any check's) as a steps × rows grid: one column
# per engine step, one row per logits row (row 0 the target position, row j the j-th draft).
# A cell shows the token that row emitted, decoded (struck through: sampled but not emitted;
# "–": nothing sampled after a rejected draft); **F** marks a row the budget forced, a blue
# underline an accepted draft; the cell where the budget puts `</think>` is outlined green
# (honoured) or red (violated); ⚠ over a step flags budget state that loses the budget (gate
# off, fast path, device ≠ host budget, no kernel). Move the window with the buttons or the
# slider (the strip above the grid is every step of the request); click a cell for its
# details, including `</think>`'s logit before and after the bias.

# %%
views.step_explorer(frames, verdict, decode)

# %% [markdown]
# The same grid as static HTML (what an exported copy of this notebook keeps).

# %%
HTML(views.static_steps_html(frames, verdict, decode))

# %% [markdown]
# ## Steps: path and drafts
# Step 0 is the prefill, sampled by `Sampler`; later steps verify k drafts with
# `RejectionSampler`.

# %%
views.plot_steps(frames);

# %%
views.step_table(frames)

# %% [markdown]
# ## Per request and step: the budget's state
# `enabled`, `use_thinking_budget`, the budget on the host and on the device, the per-slot
# gate, the fast path, whether `apply` ran and launched its kernels, the marker caches, and the
# reasoning count the tracer keeps from its own copy of the token history (tokens decoded).

# %%
views.request_table(frames, decode)

# %% [markdown]
# ## Per logits row: the end token's logit before and after the bias
# For the first violated request (else the first request). A forced row jumps to +1e9: it is
# drawn in the green band above the axis. Green columns mark rows whose emitted token is
# `</think>`.

# %%
views.plot_end_logits(frames, END, verdict=verdict);

# %%
views.forced_vs_emitted(frames, END)

# %%
views.row_table(frames, decode=decode)
