"""The tracer's per-step records: one ``TraceStep`` per traced step, one ``TraceCall`` per
``apply_sampling_params`` call (a step may have several: chunks), device tensors until the
tables are built.

``workbook.hooks.observe.tracer`` fills them inside the step, ``workbook.hooks.observe.budget_trace`` adds the
thinking budget's reads to a call's ``apply``, ``workbook.hooks.observe.trace_tables`` turns them into
table rows after the step. The step's outputs (sampled / emitted tokens, rejected drafts, the
guard's replaced rows) are the observer's ``Outputs`` record (``workbook.hooks.observe.outputs``), read
through ``TraceStep.out``. Deliberately no behaviour here: records only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbook.hooks.observe.outputs import StepOutput


@dataclass
class TraceCall:
    """One ``apply_sampling_params`` call (a step may have several: chunks)."""
    pos0: int = 0  # batch position of its first request (calls cover the batch in order)
    ptrs: dict = field(default_factory=dict)  # data_ptr/numel of its mapping inputs
    req_slots: Any = None  # [reqs] the device idx_mapping the call got (a clone)
    owner: Any = None  # np [reqs] the host's slots of its requests (req_id_to_index)
    out_ptr: int | None = None  # the tensor apply_sampling_params returned
    s_ptr: int | None = None  # the tensor the sampler / rejection sampler consumed
    end_s: Any = None  # [rows, E] end columns of that tensor
    top_s: Any = None  # (vals, ids) [rows, 2]
    slots: Any = None  # [rows] expanded_idx_mapping
    local_pos: Any = None  # [rows]
    input_ids: Any = None  # [rows]
    gate: Any = None  # np [reqs]
    gate_slots: Any = None  # np [reqs]
    end_in: Any = None  # [rows, E]
    end_final: Any = None
    top_in: Any = None  # (vals, ids) [rows, k]
    top_final: Any = None
    fast_path: bool | None = None
    apply_called: bool = False
    apply: dict = field(default_factory=dict)


@dataclass
class TraceStep:
    index: int
    req_ids: list
    idx_mapping: np.ndarray
    idx_mapping_dev: Any  # the batch's device copy (read within this step only)
    cu_num_logits: np.ndarray
    num_draft_tokens: int
    owner: np.ndarray = None  # [reqs] each request's slot as registered (req_id_to_index)
    index_moved: list = field(default_factory=list)  # requests req_id_to_index moved since
    path: str | None = None
    calls: list = field(default_factory=list)
    out: StepOutput | None = None  # the step's outputs (the observer's ``Outputs``)
    total_len_after: Any = None
    proposed: Any = None

    # the outputs as the tables read them (recorded once by ``Outputs``, shared)
    sampled_vllm = property(lambda s: s.out and s.out.sampled_vllm)  # before the guard
    num_sampled_vllm = property(lambda s: s.out and s.out.num_sampled_vllm)
    sampled = property(lambda s: s.out and s.out.sampled)  # final (emitted)
    num_sampled = property(lambda s: s.out and s.out.num_sampled)
    num_rejected = property(lambda s: s.out and s.out.num_rejected)
    guard_fixed = property(lambda s: s.out and s.out.guard_fixed)
