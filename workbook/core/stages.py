"""The stages of an MRV2 step, in pipeline order: one list for every contract.

Each ``Stage`` is one thing Model Runner V2 does to a request's logits rows or output between
``add_request`` and what the user reads, and what it must do there (``does``); ``budget`` says
the same for the thinking budget where its evidence reads it more precisely (the catalogue
``workbook.core.hypotheses`` shows it). The budget's cause chain (``workbook.run.budget.stages``), the
contracts' ``stages`` (``workbook.core.contracts``), the row judge (``workbook.run.constraints.rowjudge``)
and the trace-wide contract checks name a stage only from ``NAMES``; a verdict's ``stage``
(``workbook.run.verdicts.Verdict``) is one of them, or ``UNLOCATED`` where only the
differential against the healthy reference saw the change (no stage named).

Order: registration and the batch's mapping come first, the grammar bitmask is applied by the
runner before the sampler, then the gate and the logits processors (``apply``; its draft rows
separately, the way speculative decoding adds them), sampling, the rejection sampler's
acceptance, the commit of the sampled tokens, and what the host does after (logprob rows,
prompt logprob rows, detokenizing, stop strings, lengths). Not here: any rule (their modules).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    does: str  # what the stage must do, for every contract
    budget: str = ""  # the thinking budget's reading of it (empty: the budget does not pass it)


STAGES: tuple[Stage, ...] = (
    Stage("configuration", "the run is served by Model Runner V2",
          "the run is served by Model Runner V2"),
    Stage("state", "the sampler's per-constraint state is enabled in the worker",
          "ThinkingBudgetState is enabled in the worker (all three marker id lists)"),
    Stage("registration", "add_request writes the request's parameters into its slot's "
          "sampling state", "add_request sets use_thinking_budget[slot] and the host budget"),
    Stage("batch mapping", "the batch hands every request's rows to the slot the host "
          "registered it at",
          "the batch hands every request's rows (idx_mapping, expanded_idx_mapping) to the slot "
          "the host registered it at (req_states.req_id_to_index): checked before any per-slot "
          "value is judged"),
    Stage("grammar bitmask", "the structured output's bitmask masks exactly what its grammar "
          "rejects, on every row (draft rows included)"),
    Stage("gate", "the per-slot gate lets a constrained slot through: logits processing runs "
          "(apply_sampling_params does not return its input)",
          "the per-slot gate lets the budgeted slot through: logits processing runs and calls "
          "ThinkingBudgetState.apply"),
    Stage("launch", "a processor with a constrained slot in the batch launches its kernels",
          "apply launches its kernels when a slot of the batch has a budget"),
    Stage("device state", "what the processors read at the request's own slot equals the host "
          "truth (parameters, committed history)",
          "what the kernels read at the request's own slot equals the host truth: marker ids, "
          "budget view, committed history, marker caches"),
    Stage("apply", "with right inputs, each processed row is what the contracts predict from "
          "its raw row, the committed history and its draft position",
          "with right inputs, +1e9 lands in exactly the due end column of exactly the rows "
          "whose reasoning count reached the budget (budget.row_truth): in every due row, and "
          "in no row that is not due"),
    Stage("apply on draft rows", "the same on the draft rows of speculative decoding, where "
          "the committed history is extended by the row's earlier drafts"),
    Stage("sampling", "the sampler samples from the processed tensor, and a row's own sample "
          "respects it", "the sampler samples from the tensor apply biased, and a forced row "
          "yields the forced token"),
    Stage("acceptance", "the rejection sampler accepts no draft the processed row excludes",
          "the rejection sampler accepts no draft past a forced row"),
    Stage("commit", "the token committed is the token sampled",
          "the token committed is the token sampled"),
    Stage("logprob row selection", "the logprobs returned are those of the row that produced "
          "each token, in the mode asked for"),
    Stage("prompt row selection", "the prompt logprobs returned are those of the rows that "
          "predict each prompt position"),
    Stage("host-side post-processing", "what the host does after the step (detokenizing, stop "
          "strings, lengths) keeps the output the contracts promise"),
)

NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
BY_NAME = {s.name: s for s in STAGES}
# a verdict's stage where only the differential against the healthy reference saw the change
UNLOCATED = "differential vs none"
BUDGET: dict[str, str] = {s.name: s.budget for s in STAGES if s.budget}


def order(name: str | None) -> int:
    """A stage's place in the pipeline (``UNLOCATED`` and unknown names last)."""
    return NAMES.index(name) if name in NAMES else len(NAMES)
