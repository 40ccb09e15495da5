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
# # 05 — Integrity: who overwrites the budget state, and does the budget hold anyway?
#
# On the reporter's Thor the device tensors of `ThinkingBudgetState` — the `<think>` /
# `</think>` marker ids, the marker caches — read `[0]` after the initial profiling run, with
# storage and `_version` unchanged: something that is not a PyTorch write to them overwrote
# them, and with the start marker at 0 the budget kernel never forces `</think>`.
#
# This notebook runs one start-up under the **start-up watch** (`workbook.hooks.watch`): the
# bytes of every watched tensor (markers, marker caches, scan positions, the budget's device
# view, canary tensors allocated next to them) are compared at every start-up phase boundary of
# MRV2 and at every step afterwards; with `localize` the phase that changed them is narrowed to
# the module forward and — at level `op` — the aten op or Triton launch. Then the same request
# with the **guard** (`workbook.hooks.guard`: marker ids compiled into its kernel, per-slot
# state triple-redundant) shows whether the budget holds regardless.
#
# On healthy vLLM the bug does not occur: `fault` injects an out-of-band writer (`H-i-*`, a raw
# alias write hidden in one module, active only in the profiling run or at step 3) so that the
# timeline has something to show. On the reporter's machine: `fault = "none"`.

# %% tags=["parameters"]
model: str = "tiny-mimo-mtp"  # tiny model name (workbook.core.models.MODELS) or a checkpoint folder
spec_method: str = "mtp"  # mtp | none | eagle | ngram | draft_model
num_spec_tokens: int = 4  # draft tokens per step (k)
runner: str = "v2"  # the watch needs Model Runner V2
attention_backend: str = None  # e.g. FLASHINFER, FLASH_ATTN, TRITON_ATTN (None: vLLM's pick)
max_model_len: int = 1024  # engine context length
max_num_seqs: int = 8  # engine batch size
enforce_eager: bool = True  # localization needs eager (#54906 fails eager too)
dtype: str = "auto"  # model dtype
kv_cache_bytes: int = 67108864  # KV cache size in bytes (None: gpu_memory_utilization decides)
gpu_memory_utilization: float = None  # fraction of GPU memory (None: vLLM's default)
engine_kwargs: dict = {}  # extra keyword arguments for vllm.LLM
reasoning_parser: str = "qwen3"  # vLLM reasoning parser
reasoning_start_str: str = None  # vLLM --reasoning-config start string (None: the parser's)
reasoning_end_str: str = None  # string forced when the budget binds (None: the parser's)
thinking_token_budget: int = 1  # budget of the reported request
max_tokens: int = 12  # completion length of the reported request
temperature: float = 0.0  # 0: greedy
top_p: float = 1.0  # nucleus sampling
top_k: int = -1  # -1: off
ignore_eos: bool = True  # keep generating past end-of-sequence
mode: str = "in-process"  # in-process | server (the watch reaches vllm serve through the plugin)
fault: str = "H-i-profile-mtp"  # an out-of-band writer (H-i-profile, H-i-profile-mtp, H-i-step) or none
watch: bool = True  # the start-up watch
localize: str = "op"  # none | module | op: narrow the first unexpected change down
localize_within: str = ""  # op level only inside this module (from a module-level run)
localize_timeout_s: float = 600.0  # localization stops here and keeps what it narrowed down
cpu_profile_run: bool = True  # CPU only: run the profiling run the GPU worker always runs
guard_check: bool = True  # then: checks A/B with vLLM alone vs with the guard (in-process only)
trace: bool = True  # record the per-step trace (workbook.hooks.observe.tracer)
sanitize: str = "page"  # none | page | nvtx | auto: a second start-up with the markers read-only names the writer (page: the CPU twin; nvtx: GPU, under compute-sanitizer — slow; auto: nvtx on a GPU, page on CPU)
planted_writer: str = ""  # a test writer hidden in the drafter's propose for that start-up: alias_fill | memset | triton_store ("": none)
caching: str = ""  # GPU: PyTorch's caching allocator for that start-up, on | off ("": as set)
sanitize_timeout_s: float = 600.0  # seconds for the sanitized start-up (memcheck is slow)
outdir: str = ""  # folder for the evidence files (empty: keep them in memory only)
checks: list = []  # deterministic checks of the pipeline run: A, B

# %% [markdown]
# ## Configuration
# The parameters become a `RunConfig`; `validate` rejects a bad one before any engine starts
# (e.g. a profiling-run fault on a CPU worker that skips the profiling run, localization
# without eager mode).

# %%
import pandas as pd
from IPython.display import Markdown, display

from workbook.core.config import RunConfig
from workbook.report import views
from workbook.run import integrity, pipeline
from workbook.vllm import env as wb_env

cfg = RunConfig.from_params({**globals(), "guard": False, "sanitize": "none"})  # sanitized below
if wb_env.on_cpu() is False:
    cfg = cfg.replace(cpu_profile_run=False)  # the GPU worker always runs the profiling run
pd.DataFrame({"value": {k: repr(v) for k, v in cfg.to_dict().items()
                        if k in ("model", "spec_method", "fault", "watch", "localize",
                                 "localize_within", "cpu_profile_run", "enforce_eager",
                                 "mode")}})

# %% [markdown]
# ## Run
# A fresh engine started with the watch (and the fault) in place; the reported request; the
# trace; the watch's evidence (`watch.json`); the diagnosis with its `integrity` section.

# %%
res = pipeline.run(cfg, outdir or None, checks=checks)
w = res.watch or {}
pd.DataFrame({"seconds": res.timings}).round(2)

# %% [markdown]
# ## The phases that really ran
# Named from the wrapped methods that fired (`workbook.vllm.startup`): on a GPU the worker
# always runs the profiling run (target forward, then the drafter's `propose(dummy_run=True)`);
# the CPU worker of vLLM 0.30+ skips it unless `cpu_profile_run`.

# %%
display(Markdown(" → ".join(f"**{p}**" if any(c.get("top_phase") == p for c in
                                               w.get("changes") or []) else p
                            for p in w.get("phase_order") or [])))
integrity.phase_table(w)

# %% [markdown]
# ## Where the watched tensors live
# Address order at state creation, with the canaries allocated right before and after the
# state (a writer that overruns a neighbour shows up in a canary).

# %%
pd.DataFrame(w.get("layout") or [], columns=["name", "ptr_hex", "offset", "nbytes", "device"])

# %% [markdown]
# ## Timeline: what changed when
# Every phase-level boundary of the start-up and the first real steps, with the three marker
# tensors' values (start / end / natural end) as read there. `changed`: bytes that moved since
# the previous boundary; `unexpected`: moved outside the methods allowed to write them.

# %%
integrity.timeline_table(w)

# %% [markdown]
# ## The culprit
# The first unexpected change: the phase (frames common to the last clean and the first dirty
# boundary), the values before and after, whether the pointer or `_version` moved, and — from
# the localization — the module forward and the op or kernel launch between whose boundaries
# the bytes changed.

# %%
v = res.verdict.get("integrity") or integrity.verdict_from_watch(w)
display(Markdown(f"**{views.verdict_heading(v)}** — {v.get('saw') or 'no unexpected change'}"))
views.values_table({k: v.get(k) for k in ("phase", "module", "op", "kernel", "tensors", "before",
                                          "after", "last_clean", "first_dirty",
                                          "startup_observed")}, "culprit", missing="none found")

# %%
integrity.changes_table(w)

# %% [markdown]
# Localization: its level, how many checks it made and why it stopped; aliasing writes (an op
# that mutated watched memory through another tensor object) and Triton launches handed a
# pointer into watched memory, named regardless of values.

# %%
loc = w.get("localization") or {}
display(views.values_table({k: loc.get(k) for k in ("level", "within", "checks", "elapsed_s",
                                                     "complete", "stopped")}, "localization"))
views.table(loc.get("alias_writes") or [], "No op wrote watched memory through an alias.",
            columns=["op", "tensor", "alias", "module", "phase"])

# %% [markdown]
# ## Where the markers' neighbours live
# The watched blocks' neighbours in their caching-allocator segment (offset from the marker,
# size, state and, with PyTorch's memory history on, the code that allocated them): the suspects
# of an overrun. On CPU there are no such segments; the evidence says what CPU can tell.

# %%
lay = (w.get("layout_evidence") or {}).get("at_state_creation") or {}
display(Markdown(lay.get("note") or f"platform {lay.get('platform')}, caching allocator "
                 f"{'on' if lay.get('caching_allocator') else 'off'}, memory history "
                 f"{'on' if lay.get('memory_history') else 'off'}"))
pd.DataFrame([{"tensor": n, **{k: v for k, v in nb.items() if k != "allocated_by"},
               "allocated_by": " ← ".join(nb.get("allocated_by") or [])}
              for n, t in (lay.get("tensors") or {}).items() if n.startswith("reasoning")
              for nb in t.get("neighbours") or []] or
             [{"tensor": n, **t} for n, t in (lay.get("tensors") or {}).items()])

# %% [markdown]
# ## Naming the writer: the sanitizer stage
# The watch names the phase and the window; the sanitizer stage names the code. A second,
# fresh start-up runs in a child process with the marker tensors read-only
# (`workbook.hooks.watch.protect`): on a GPU through NVTX memory permissions under
# `compute-sanitizer --tool memcheck` (every write to them is reported with the kernel and the
# host backtrace down to the Python frame, in bounds or not, PyTorch op or not); on CPU the
# twin — the markers on read-only pages, the write raises SIGSEGV and the fault handler writes
# the Python stack. One start-up names the first writer only (the process, or the CUDA context,
# ends there). What the host lacks (compute-sanitizer, NVTX headers, a compiler) is named and
# the stage skipped.

# %%
from workbook.run.writer import command as watchcmd

named = None
if sanitize == "page" and wb_env.on_cpu() is False:
    display(Markdown("`sanitize = \"page\"` is the CPU twin; on this GPU host set "
                     "`sanitize = \"nvtx\"` (compute-sanitizer memcheck: a slow start-up)."))
elif sanitize != "none":
    import os
    import tempfile

    san_out = os.path.join(outdir, "sanitized") if outdir else tempfile.mkdtemp(prefix="wb-san-")
    named = watchcmd.run_passes(cfg.replace(sanitize=sanitize, localize="none"), san_out,
                                "none", timeout_s=sanitize_timeout_s, caching=caching or None,
                                writer=planted_writer or None)
    p0 = named["passes"][0]
    for line in integrity.writer_lines(p0["sanitizer"], p0.get("writer")):
        display(Markdown(line))
    wr = p0.get("writer") or {}
    display(pd.DataFrame({"writer": {k: json.dumps(wr.get(k), default=str) for k in
                                     ("source", "kernel", "access", "size", "tensor",
                                      "frame", "module", "in_forward_of", "phase")
                                     if wr.get(k) is not None}}))
    display(pd.DataFrame({"stack (innermost first)": wr.get("stack") or []}))
else:
    display(Markdown("The sanitizer stage was not asked for (`sanitize = \"none\"`)."))

# %% [markdown]
# ## The budget holding with the fix
# The same engine (its state already overwritten, if a fault struck): checks A (budgets 1, 0
# → `</think>` first) and B (drafts accepted, `</think>` exactly at budgets 2..9) with vLLM
# alone, then with the guard. The guard's marker ids are constants of its kernel; the host
# keeps each request's budget, reasoning count and last tokens (memory no device writer can
# reach) and passes them with every launch, and the kernel checks the three device replicas of
# that state against the host's truth, repairing (and logging) every field that differs. A
# request the host says has no budget is never forced. So what overwrote vLLM's state — even
# all three of the guard's replicas — cannot take the budget with it. `guard_repaired`: the
# fields of its own state the guard repaired.

# %%
from workbook.hooks import guard
from workbook.run.budget import experiments

rows = []
if guard_check and cfg.mode == "in-process" and res.engine is not None:
    rows = experiments.checks_under_fault(res.engine, None)
    st = guard.state(res.engine.runner)
    if st is not None:
        rows[-1]["guard_repaired"] = st.check_repairs()
pd.DataFrame(rows)

# %% [markdown]
# ## What the watch cost
# Checks during start-up (synchronizing, with localization) and per step afterwards (a device
# ring buffer, no host sync). `benchmarks/step_overhead.py --watch` measures the per-step ratio
# side by side in one engine.

# %%
pd.DataFrame({"value": {**(w.get("overhead") or {}), **(w.get("steps") or {})}})
