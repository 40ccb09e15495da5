"""The hypothesis catalogue: every way the budget can be lost, and the fault that injects it.

One entry per hypothesis: its id, the pipeline stage it lives in, a title, what it means, the
evidence in the trace that confirms it (what ``workbook.run.diagnose`` looks for), and the A/B
check or probe that would confirm it independently. ``FAULTS`` lists the removable faults of
``workbook.hooks.faults``, each tied to the hypothesis it reproduces in healthy vLLM.

Read by validation (``RunConfig.fault``), the faults, the diagnosis, the notebooks and the
report. Deliberately not here: how a fault is built or how a rule decides (their modules).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Hypothesis:
    id: str
    stage: str  # the pipeline stage where the budget is lost
    title: str
    meaning: str
    evidence: str  # what in the trace / effective configuration confirms it
    confirm: str  # the A/B check or probe that separates it from the others

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fault:
    name: str
    hypothesis: str
    description: str
    at_engine_start: bool = False  # applied to the process environment before vLLM starts
    before_start: bool = False  # patches installed before the engine starts (start-up faults)


HYPOTHESES: dict[str, Hypothesis] = {h.id: h for h in [
    Hypothesis("H-h", "configuration", "not MRV2: the run was served by the V1 runner",
               "V2 was asked for, but vLLM silently fell back to the V1 runner",
               "effective runner class is not in vllm.v1.worker.gpu, or no MRV2 step traced",
               "runner V1 vs V2 (VLLM_USE_V2_MODEL_RUNNER=1 must fail loudly, not fall back)"),
    Hypothesis("H-b", "state", "ThinkingBudgetState disabled in the worker",
               "ThinkingBudgetState.enabled is False (a marker id list missing in the worker)",
               "enabled=False at registration or apply",
               "effective reasoning_*_token_ids; V1 (which does not need natural-end ids)"),
    Hypothesis("H-c", "registration", "request budget not registered",
               "the request's thinking_token_budget never reached the per-slot state",
               "use_thinking_budget False or host budget != the request's budget",
               "batch of 1 vs several; re-send the request"),
    Hypothesis("H-a", "gate", "gate bypass: logits processing skipped for this request",
               "apply_sampling_params took its fast path: the per-slot gate lacks the budget",
               "gate False or fast path True for a budgeted slot",
               "greedy vs sampled (the fast path is greedy-only), pre/post vLLM #52329"),
    Hypothesis("H-d", "kernel", "budget kernel never forced the row (stale device budget or "
               "kernel)",
               "apply launched its kernels for a budgeted slot, yet the row was not forced",
               "device budget != host budget, or launched and end logit not raised",
               "eager vs CUDA graphs; markers re-uploaded; batch of 1"),
    Hypothesis("H-f", "launch", "launch decision frozen: apply ran but launched no kernel",
               "a Python-side decision captured once (graph capture / warm-up) never re-taken",
               "apply ran for a budgeted, enabled slot but launched no kernel",
               "eager vs CUDA graphs (enforce_eager=True)"),
    Hypothesis("H-e", "sampling", "row forced, but the token was sampled from other logits",
               "the forced logits were not the ones the sampler used",
               "forced after apply, not forced in the logits handed to sampling, or a forced "
               "row emitted another token with no accepted draft explaining it",
               "MTP on/off; greedy vs sampled"),
    Hypothesis("H-g", "acceptance", "a draft was accepted over the forced end token",
               "the rejection sampler accepted a draft without checking the forced target row",
               "forced row, next row's draft (not </think>) accepted",
               "rejection_sample_method; MTP k=1; drafts rejected (random weights)"),
    # H-i: minimal entry (issue #13); the attribution issue (#12) owns its full wording.
    Hypothesis("H-i", "state", "budget state overwritten on the device (out-of-band writer)",
               "ThinkingBudgetState's device tensors (markers, marker caches, budget view) hold "
               "values no PyTorch write to them put there: storage and _version unchanged",
               "the start-up watch (workbook.hooks.watch) saw a watched tensor change outside "
               "its allowed writers",
               "start-up watch + localization; compute-sanitizer memcheck; the guard holds"),
]}

FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("H-a", "H-a", "gate bypass: greedy requests skip logits processing"),
    Fault("H-b", "H-b", "ThinkingBudgetState disabled in the worker"),
    Fault("H-c", "H-c", "request's budget never registered"),
    Fault("H-d", "H-d", "device copy of the budget stale while the host copy is right"),
    Fault("H-d-draft", "H-d", "budget kernel never forces draft rows"),
    Fault("H-e", "H-e", "row forced but token sampled from unprocessed logits"),
    Fault("H-f", "H-f", "launch decision frozen at the first (warm-up) step"),
    Fault("H-g", "H-g", "synthetic acceptance of drafts"),
    Fault("H-h", "H-h", "V2 run silently served by V1", at_engine_start=True),
    # -- issue #13: out-of-band writers (workbook.hooks.faults, end of _BUILDERS) ------------
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
    h = HYPOTHESES.get(hyp)
    return h.title if h else None


def runtime_faults() -> list[str]:
    """Faults that can be injected into a running engine (not at engine start)."""
    return [n for n, f in FAULTS.items() if not (f.at_engine_start or f.before_start)]


def startup_faults() -> list[str]:
    """Faults whose patches must be installed before the engine starts."""
    return [n for n, f in FAULTS.items() if f.before_start]


def table() -> list[dict]:
    """The catalogue as rows (notebooks, report)."""
    return [{**h.to_dict(), "faults": [f.name for f in FAULTS.values() if f.hypothesis == h.id]}
            for h in HYPOTHESES.values()]
