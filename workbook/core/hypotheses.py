"""The hypothesis catalogue: every way the budget can be lost, and the fault that injects it.

One entry per hypothesis: its id, the pipeline stage it lives in (``STAGES``, in pipeline order,
each with what it must do), a title, what it means, the evidence in the trace that confirms it
(what ``workbook.run.budget.diagnose`` looks for), the A/B check or probe that would confirm it
independently, and what each automatic probe (``workbook.run.budget.probes``) must show if it is the
cause. ``FAULTS`` lists the removable faults of
``workbook.hooks.faults.budget``, each tied to the hypothesis it reproduces in healthy vLLM.

Read by validation (``RunConfig.fault``), the faults, the diagnosis, the notebooks and the
report. Deliberately not here: how a fault is built or how a rule decides (their modules).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from workbook.core import stages as _stages


@dataclass(frozen=True)
class Hypothesis:
    id: str
    stage: str  # the pipeline stage where the budget is lost (STAGES)
    title: str
    meaning: str
    evidence: str  # what in the trace / effective configuration confirms it
    confirm: str  # the A/B check or probe that separates it from the others
    # the verdict of the violating request each probe (workbook.run.budget.probes.PROBES) must give
    # if this hypothesis is the cause: "honored" / "violated"; absent: no prediction
    predicts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fault:
    name: str
    hypothesis: str
    description: str
    at_engine_start: bool = False  # applied to the process environment before vLLM starts
    before_start: bool = False  # patches installed before the engine starts (start-up faults)
    # the side of the budget's contract it breaks: "missing" (the end is not where it is due),
    # or where it forces the end although it is not due (budget.VIOLATION_KINDS: "early",
    # "unbudgeted", "twice")
    side: str = "missing"


# The stages a budgeted logits row goes through, in pipeline order, and what each must do: the
# one list of MRV2 stages (workbook.core.stages), as the thinking budget reads it
STAGES: dict[str, str] = _stages.BUDGET

_BUDGET_STATE = {"markers": "violated", "budget": "violated", "caches": "violated"}
# ``predicts`` is about the violation's side of the contract. On the other side — the end
# forced where it was not due (budget.VIOLATION_KINDS other than "missing") — the guard has
# no prediction: it takes such an end back in a greedy row (the row's argmax without the
# forcing), not in a sampled row (vLLM's draw on the unforced row is not reproduced)
NO_PREDICTION_WHEN_FORCED = ("guard",)
_MRV2 = {"guard": "honored", "v1": "honored"}

HYPOTHESES: dict[str, Hypothesis] = {h.id: h for h in [
    Hypothesis("H-h", "configuration", "not MRV2: the run was served by the V1 runner",
               "V2 was asked for, but vLLM silently fell back to the V1 runner",
               "effective runner class is not in vllm.v1.worker.gpu, or no MRV2 step traced",
               "runner V1 vs V2 (VLLM_USE_V2_MODEL_RUNNER=1 must fail loudly, not fall back)"),
    Hypothesis("H-b", "state", "ThinkingBudgetState disabled in the worker",
               "ThinkingBudgetState.enabled is False (a marker id list missing in the worker)",
               "enabled=False at registration or apply",
               "effective reasoning_*_token_ids; V1 (which does not need natural-end ids)",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated", "batched": "violated"}),
    Hypothesis("H-c", "registration", "request budget not registered as asked",
               "the per-slot state does not hold the request's thinking_token_budget: lost, "
               "altered, or a budget registered for a request that asked for none",
               "use_thinking_budget / host budget != the request's budget (-1: none)",
               "batch of 1 vs several; re-send the request",
               # no guard / V1 prediction: a budget lost before the runner escapes them too
               {**_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-a", "gate", "gate bypass: logits processing skipped for this request",
               "apply_sampling_params took its fast path or never called the budget's apply: "
               "the per-slot gate lacks the budget",
               "gate False, fast path True, or apply not called for a budgeted slot",
               "greedy vs sampled (the fast path is greedy-only), pre/post vLLM #52329",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-f", "launch", "launch decision frozen: apply ran but launched no kernel",
               "a Python-side decision captured once (graph capture / warm-up) never re-taken",
               "apply ran for a budgeted, enabled slot but launched no kernel",
               "eager vs CUDA graphs (enforce_eager=True); batch of 1",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated", "batched": "violated",
                "eager": "honored"}),
    Hypothesis("H-i", "device state", "the state's device marker ids were overwritten out of "
               "band (no tracked PyTorch write)",
               "the marker id tensors of ThinkingBudgetState hold values no tracked PyTorch "
               "write put there (an out-of-band writer — another kernel overwrote them during "
               "start-up profiling or later — or a write through an untracked alias); the "
               "kernel then finds no <think> and never forces",
               "device start/end/natural-end ids != the configured ids, with storage and "
               "_version unchanged",
               "markers re-uploaded from the host config; V1 (no device markers); "
               "compute-sanitizer memcheck of a start-up",
               {**_MRV2, "markers": "honored", "budget": "violated", "caches": "violated",
                "alone": "violated", "batched": "violated", "no_spec": "violated"}),
    Hypothesis("H-i-inband", "device state", "the state's device marker ids were changed by a "
               "PyTorch write (in band)",
               "the marker id tensors of ThinkingBudgetState were written through PyTorch "
               "(their _version moved) or replaced by other tensors (storage moved): code "
               "running in the process changed the ids the kernel reads",
               "device start/end/natural-end ids != the configured ids, with _version moved "
               "or storage moved",
               "markers re-uploaded from the host config; a torch write hook / the watch's "
               "localization names the writing op",
               {**_MRV2, "markers": "honored", "budget": "violated", "caches": "violated",
                "alone": "violated", "batched": "violated", "no_spec": "violated"}),
    Hypothesis("H-d", "device state", "stale device view of the budget (device != host)",
               "the device copy of the per-slot budget the kernel reads differs from the host "
               "copy (a UVA / staged write that never reached the device)",
               "budget_device != budget_host for the slot",
               "device budget re-copied from the host before apply; batch of 1",
               {**_MRV2, "budget": "honored", "caches": "violated", "markers": "violated",
                "alone": "violated"}),
    Hypothesis("H-d-history", "device state", "device view of the committed history is wrong",
               "the committed tokens / length the kernel reads on the device differ from the "
               "tokens committed (all_token_ids / total_len)",
               "total_len or the checksum of all_token_ids[slot, :total_len] != the host history",
               "batch of 1; eager vs CUDA graphs",
               {"guard": "honored", "markers": "violated", "budget": "violated",
                "caches": "violated", "alone": "violated"}),
    Hypothesis("H-d-cache", "device state", "marker cache corrupted between steps",
               "the cached last <think> / </think> / scan positions entering apply do not "
               "describe the committed history (a cached position lost, moved, or past the "
               "history's length), so the cache gives another reasoning state than the "
               "history: the end of reasoning is missed, or its count restarts",
               "the marker cache before apply, replayed over the history, gives another "
               "reasoning state than the rule (the cached value that disagrees with the "
               "history is reported, and how)",
               "marker caches reset before apply (a cold scan of the history)",
               {**_MRV2, "caches": "honored", "budget": "violated", "markers": "violated",
                "alone": "violated"}),
    Hypothesis("H-j", "batch mapping", "the batch did not hand this request's rows to the "
               "budget kernel at its own slot (a wrong row -> slot mapping, or its rows "
               "left out when batched with others)",
               "the batch's row->slot mapping does not send this request's rows to the slot "
               "the host registered it at, or its rows are forced alone but not in this batch",
               "idx_mapping / expanded_idx_mapping (as the call or the kernel got them) != "
               "req_states.req_id_to_index of the request; or the batch-of-1 probe honored "
               "while the batch violated",
               "batch of 1 vs batch of several mixed budgets",
               {**_MRV2, **_BUDGET_STATE, "alone": "honored"}),
    Hypothesis("H-d-kernel", "apply", "apply / the budget kernel forced wrong although the "
               "budget state was right",
               "the budget state (markers, budget, history, caches, mapping) equals the host "
               "truth, yet a due row was not forced, was biased too weakly to win, a row that "
               "was not due was forced, or the marker scan came out wrong — in the kernel, or "
               "in what apply handed it instead of the state's tensors: a defect or miscompile "
               "of apply / the kernel",
               "state right; due row without a winning +1e9 (the bias found is reported), a "
               "non-due row biased, or apply handed the kernel other tensors",
               "eager vs CUDA graphs; MTP off (draft rows only?); batch of 1",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-p", "apply", "another logits processor raised the end of reasoning",
               "the end column was raised before the budget's own apply — by the logit-bias, "
               "penalties, bad-words or a custom logits processor — in a row where no end was "
               "due, and the end was emitted there: the budget's contract is broken whatever "
               "stage put the end there",
               "end_logit_before_apply above end_logit_raw in the emitting row (the trace's "
               "end column after each stage), the budget's apply adding nothing",
               "the request without its other sampling parameters; batch of 1",
               {**_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-d-column", "apply", "forcing bias written into another column",
               "the due row received +1e9, but in a column other than the due end token",
               "bias_cols of the due row do not include the due token",
               "multi-token end ids; batch of 1",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-e", "sampling", "forced, but not in the tensor the sampler used",
               "the +1e9 went into a tensor that was not the one sampled (a copy), or was "
               "removed from it before sampling",
               "apply's (or the kernel's) tensor forced at the due column, the tensor the "
               "sampler consumed not (its storage differs, or the value was overwritten)",
               "MTP off; greedy vs sampled",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-e-sample", "sampling", "the sampler drew another token from a forced row",
               "the tensor the sampler consumed held +1e9 at the due column, yet the row's own "
               "sample was another token: the sampler ignores the processed logits",
               "due_logit_sampled >= 1e8 and the row's own sample (not a draft) != due token",
               "greedy vs sampled; MTP off",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated"}),
    Hypothesis("H-g", "acceptance", "a draft was accepted over the forced end token",
               "the rejection sampler accepted a draft without checking the forced target row",
               "forced in the sampled tensor, the position's token came from an accepted draft "
               "!= the forced token, while forced rows sampled on their own did yield it",
               "rejection_sample_method; MTP off / k=1; drafts rejected (random weights)",
               {**_MRV2, **_BUDGET_STATE, "alone": "violated", "no_spec": "honored"}),
    Hypothesis("H-k", "commit", "the token was changed after sampling",
               "the sampler produced the forced token, but another one was emitted / committed",
               "sampled_vllm == due token, emitted token != it, no guard fix",
               "guard on; batch of 1",
               {**_BUDGET_STATE, "alone": "violated"}),
]}

FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("H-a", "H-a", "gate bypass: greedy requests skip logits processing"),
    Fault("H-b", "H-b", "ThinkingBudgetState disabled in the worker"),
    Fault("H-c", "H-c", "request's budget never registered"),
    Fault("H-d", "H-d", "device copy of the budget stale while the host copy is right"),
    Fault("H-d-draft", "H-d-kernel", "budget kernel never forces draft rows"),
    Fault("H-e", "H-e", "row forced but token sampled from unprocessed logits"),
    Fault("H-f", "H-f", "launch decision frozen at the first (warm-up) step"),
    Fault("H-g", "H-g", "synthetic acceptance of drafts"),
    Fault("H-h", "H-h", "V2 run silently served by V1", at_engine_start=True),
    Fault("H-i", "H-i", "the reporter's state: device marker ids and marker caches zeroed in "
          "place after start through a raw alias (storage and _version unchanged)"),
    Fault("H-i-inband", "H-i-inband", "device marker ids zeroed after start by an ordinary "
          "PyTorch write (fill_: _version moves)"),
    Fault("H-d-cache", "H-d-cache", "marker cache loses the start marker after each commit"),
    Fault("H-d-restart", "H-d-cache", "marker cache moves the start to the last committed "
          "token after each commit (the reasoning count restarts)"),
    Fault("H-d-column", "H-d-column", "the budget's +1e9 lands in the column after </think>"),
    Fault("H-e-copy", "H-e", "the budget forces a copy of the logits that is never sampled"),
    Fault("H-e-sample", "H-e-sample", "the sampler masks out forced columns before sampling"),
    Fault("H-j", "H-j", "the budget kernel is launched with the first request's rows only"),
    Fault("H-k", "H-k", "the end token is replaced after sampling, before commit"),
    # -- issue #26: the other side — the end forced where it is not due ---------------------
    Fault("H-d-early", "H-d-kernel", "the budget kernel forces the end in every draft row of "
          "a budgeted request, due or not (before the budget binds)", side="early"),
    Fault("H-d-unbudgeted", "H-d-kernel", "the budget kernel forces the end in every row of a "
          "request without a budget", side="unbudgeted"),
    Fault("H-d-twice", "H-d-kernel", "the budget kernel forces the end again in every row of a "
          "budgeted request whose reasoning already ended", side="twice"),
    # -- issue #13: out-of-band writers (workbook.hooks.faults.budget, end of _BUILDERS) ------------
    Fault("H-i-profile", "H-i", "a writer hidden in the target's first MLP zeroes the budget "
          "state's markers and marker caches through a raw alias of their storage, only during "
          "the profiling run", before_start=True),
    Fault("H-i-profile-mtp", "H-i", "the same writer hidden in the MTP drafter's MLP, active "
          "only during the profiling run's propose (needs MTP)", before_start=True),
    Fault("H-i-step", "H-i", "the same writer in the target's first MLP, active only at real "
          "engine step 3 (after start-up); also zeroes replica 0 of the guard's state",
          before_start=True),
]}

PROFILE_FAULTS = ("H-i-profile", "H-i-profile-mtp")  # active only during the profiling run

FAULT_CHOICES = ("none", *FAULTS)


def title(hyp: str | None) -> str | None:
    if hyp is None:
        return None
    if hyp == "unclassified":
        return "violation that no rule explains"
    if hyp == "ambiguous":
        return "several causes fit the evidence"
    h = HYPOTHESES.get(hyp)
    return h.title if h else None


def runtime_faults() -> list[str]:
    """Faults that can be injected into a running engine (not at engine start)."""
    return [n for n, f in FAULTS.items() if not (f.at_engine_start or f.before_start)]


def table() -> list[dict]:
    """The catalogue as rows (notebooks, report)."""
    return [{**h.to_dict(), "faults": [f.name for f in FAULTS.values() if f.hypothesis == h.id]}
            for h in HYPOTHESES.values()]
