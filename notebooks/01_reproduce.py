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
# # 01 — Reproduce vLLM #54906: is `thinking_token_budget` honoured?
#
# One configuration, one engine, the request of the report (`thinking_token_budget=1`,
# `max_tokens=32`, prompt ending `<think>\n`). Healthy vLLM emits `</think>` as the first
# generated token. Everything below is a thin narrative over
# `workbook.run.pipeline.run(cfg, outdir, checks)`: it starts the engine, sends the request,
# runs the deterministic checks asked for, diagnoses the trace and writes the evidence files
# into `outdir` (when given). Parameters are injected by papermill (`workbook run ENV`).

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # built-in model (workbook.core.models.names()) or a checkpoint folder
draft_model: str = None  # eagle / draft_model speculation: draft path or tiny name (None: default)
spec_method: str = "mtp"  # none | mtp | eagle | eagle3 | ngram | draft_model
num_spec_tokens: int = 4  # draft tokens per step (k)
runner: str = "v2"  # v2 | v1 | auto (auto: vLLM chooses)
max_model_len: int = 1024  # engine context length
max_num_seqs: int = 8  # engine batch size
enforce_eager: bool = True  # False: CUDA graphs (GPU only)
attention_backend: str = None  # e.g. FLASH_ATTN, FLASHINFER, TRITON_ATTN (None: vLLM's pick)
async_scheduling: bool = None  # None: vLLM's default (forced off on CPU)
dtype: str = "auto"  # model dtype
seed: int = 0  # engine and sampling seed
kv_cache_bytes: int = 67108864  # KV cache size in bytes (None: gpu_memory_utilization decides)
gpu_memory_utilization: float = None  # fraction of GPU memory (None: vLLM's default)
reasoning_parser: str = "qwen3"  # vLLM reasoning parser
reasoning_start_str: str = None  # vLLM --reasoning-config start string (None: the parser's)
reasoning_end_str: str = None  # string forced when the budget binds (None: the parser's)
engine_kwargs: dict = {}  # extra keyword arguments for vllm.LLM
tensor_parallel_size: int = 1  # vLLM tensor parallelism: one worker process per rank (docs/parallel.md)
pipeline_parallel_size: int = 1  # vLLM pipeline parallelism: one worker process per stage (docs/parallel.md)
logprobs_mode: str = None  # raw_logprobs | processed_logprobs | raw_logits | processed_logits (None: vLLM's default)
async_on_cpu: bool = False  # CPU: keep async scheduling on where vLLM turns it off (workbook.vllm.async_shim)
kv_blocks: int = None  # a KV cache this many blocks small (preemption; None: sized by kv_cache_bytes)
arrival: str = "step0"  # step0: every request added at once | staggered: request i added at step 2*i
invariance: str = "auto"  # constraints grid: each request alone on a fresh slot vs the batch (auto: where a change no contract explains | on | off)
drafter_steer: str = "none"  # none | allowed | greedy | forbidden: the drafter's proposals replaced (workbook.hooks.observe.steer)
n: int = 1  # parallel sampling: outputs per request (SamplingParams.n)
prompt_prefix: int = 0  # the constraints grid: a shared reasoning prefix this many tokens long (prefix caching, chunked prefill)
abort: str = "none"  # none | mid-step: the constraints grid aborts a constrained request after step 2
priority: str = "none"  # none | mixed: the constraints grid's requests get priorities (engine_kwargs scheduling_policy: priority)
mixed_size: int = 0  # the constraints grid's mixed batches: 0 one batch of every case, else batches of this many
thinking_token_budget: int = 1  # reasoning-token budget (-1: none)
max_tokens: int = 32  # completion length limit
temperature: float = 0.0  # 0: greedy
top_p: float = 1.0  # nucleus sampling
top_k: int = -1  # -1: off
ignore_eos: bool = True  # keep generating past end-of-sequence
enable_thinking: bool = True  # chat template kwarg
preserve_thinking: bool = True  # chat template kwarg
prompt: str = "What is 1+1?"  # user message
mode: str = "in-process"  # in-process | server
fault: str = "none"  # inject one hypothesis' fault (workbook.hooks.faults.budget), e.g. H-b
guard: bool = False  # apply the commit-time budget guard (workbook.hooks.guard)
zero_lm_head: bool = False  # zero the target lm_head so drafts are accepted (in-process only)
trace: bool = True  # record the per-step trace (workbook.hooks.observe.tracer)
row_check: bool = False  # keep every logits row's contract columns, raw and processed (workbook.hooks.observe.rowcheck)
constraint_fault: str = "none"  # inject one constraint fault (workbook.hooks.faults.constraints)
probes: bool = False  # after a violation, re-run the request with one switch per remaining cause (batch of 1, markers re-uploaded, guard on ...) to confirm it (in-process)
watch: bool = False  # start-up watch of the budget state's device tensors (workbook.hooks.watch)
localize: str = "none"  # none | module | op: narrow an unexpected state change to a module / op (implies watch)
localize_within: str = ""  # op level only inside modules whose name starts with this
localize_timeout_s: float = 600.0  # localization stops here and keeps what it narrowed down
sanitize: str = "none"  # none | auto | nvtx | page: the markers read-only so a write names its writer (implies watch)
sampler_warmup: bool = False  # the profiling run's dummy sampler with sampling params registered (vLLM PR #57926)
cpu_profile_run: bool = False  # CPU: run the worker's profiling run as the GPU worker always does
outdir: str = ""  # folder for the evidence files (empty: keep them in memory only)
checks: list = []  # deterministic checks to run as well: A, B

# %% [markdown]
# ## Configuration
# The parameters become a `RunConfig`; `validate` rejects a bad one before any engine starts.

# %%
import pandas as pd
from IPython.display import display

from workbook.core.config import RunConfig
from workbook.report import views
from workbook.run import pipeline

cfg = RunConfig.from_params(globals())
views.config_table(cfg)

# %% [markdown]
# ## Run
# Engine start, hooks (fault → guard → tracer), the reported request, the checks, the diagnosis.

# %%
res = pipeline.run(cfg, outdir or None, checks=checks)
pd.DataFrame({"seconds": res.timings}).round(2)

# %% [markdown]
# ## Effective configuration
# Read from the live engine, not from the parameters: the runner vLLM really chose, the
# speculator, attention backends, whether `ThinkingBudgetState` is enabled, the reasoning
# marker ids, and vLLM's own log lines about fallbacks.

# %%
eff = {k: v for k, v in res.effective.items() if k != "log_lines"}
views.values_table(eff, "effective")

# %%
for line in res.effective.get("log_lines", []):
    print(line)

# %% [markdown]
# ## Outcome, as the server would report it
# The fields of the report: `finish_reason`, `completion_tokens`, `reasoning_tokens`,
# `content`, the generated token ids and the first token.

# %%
def as_server_reply(o) -> dict:
    return {"finish_reason": o.finish_reason, "completion_tokens": o.completion_tokens,
            "reasoning_tokens": o.reasoning_tokens,
            "content": o.content if o.content is not None else
            "none (null): no token came after the reasoning",
            "first_token": o.first_token, "first_token_text": o.first_token_text,
            "token_ids": o.token_ids, "end_token_ids": o.end_token_ids,
            "expected_end_index": o.expected_end_index, "actual_end_index": o.actual_end_index,
            "honored": o.honored}


views.table(pd.DataFrame([as_server_reply(o) for o in res.outcomes]).T,
            "The engine returned no outcome (see the run's failure).")

# %% [markdown]
# ## Deterministic checks (docs/facts.md)
# A: greedy, budget 1 and 0 → `</think>` first. B: drafts accepted, `</think>` exactly at every
# budget 2..9.

# %%
rows = [dict(check=name, budget=o["budget"], expected=o["expected_end_index"],
             actual=o["actual_end_index"], honored=o["honored"],
             tokens=o["token_ids"][:12])
        for name, outs in res.checks.items() for o in outs]
views.table(rows, "No deterministic check was asked for in this run (`checks` is empty).",
            columns=["check", "budget", "expected", "actual", "honored", "tokens"])

# %% [markdown]
# ## Verdict
# From `workbook.run.budget.diagnose` over the trace, the effective configuration and the outcome.

# %%
v = res.verdict
display(views.verdict_markdown(v, ""))
views.table(views.first_violation(v, views.decoder(model=cfg.model)),
            "No request was violated: there is no first violating step.")

# %% [markdown]
# The evidence rows behind the hypothesis.

# %%
views.table(v.get("evidence") or [], "No evidence rows: the diagnosis names no cause "
            + ("(nothing was violated)." if v.get("verdict") == "honored" else "for this run."))
