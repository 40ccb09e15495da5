# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Commit-time guard for per-request thinking token budgets (Model Runner V2).

`ThinkingBudgetState` enforces the budget *before* sampling by boosting the
end-of-reasoning token in the logits. The guard checks the *result*: after
`GPUModelRunner.sample` produced the step's tokens (Sampler or
RejectionSampler, with or without drafts) and before they are committed,
one kernel walks each request's sampled tokens with the same semantics and,
at the first position where the budget binds and the token is not the due
end-marker token, writes that token, truncates `num_sampled` there and counts
the dropped tokens as rejected. On a correct sampling path it finds nothing
to fix; if anything between the logits and the committed token loses the
forcing, the budget still holds.

The guard keeps its own per-request state (budget, reasoning token count and
a short tail of committed tokens), staged on the host once per request from
the request's token history and copied to the device with a plain
non-blocking H2D copy. It never reads `ThinkingBudgetState`.
"""

from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.triton_utils import tl, triton
from vllm.utils.platform_utils import is_pin_memory_available

if TYPE_CHECKING:
    from vllm.config.reasoning import ReasoningConfig

_INT32_MAX = np.iinfo(np.int32).max


def _last_index_of(arr: np.ndarray, sub: list[int]) -> int:
    n = len(sub)
    if n == 0 or arr.shape[0] < n:
        return -1
    if n == 1:
        hits = np.flatnonzero(arr == sub[0])
    else:
        windows = np.lib.stride_tricks.sliding_window_view(arr, n)
        hits = np.flatnonzero(np.all(windows == np.asarray(sub), axis=1))
    return int(hits[-1]) if hits.size else -1


def get_reasoning_count(
    token_ids: list[int] | np.ndarray,
    start_token_ids: list[int],
    natural_end_token_ids: list[int],
) -> int:
    """Reasoning tokens at the end of `token_ids` (after the last start
    marker), or -1 if not in reasoning (no start marker, or a natural end
    marker starts at or after it)."""
    arr = np.asarray(token_ids, dtype=np.int64)
    last_start = _last_index_of(arr, start_token_ids)
    if last_start < 0:
        return -1
    if last_start <= _last_index_of(arr, natural_end_token_ids):
        return -1
    return int(arr.shape[0] - (last_start + len(start_token_ids)))


class ThinkingBudgetGuard:
    """Per-request state of the commit-time thinking budget guard."""

    def __init__(
        self,
        max_num_reqs: int,
        device: torch.device,
        reasoning_config: "ReasoningConfig | None",
    ):
        self.max_num_reqs = max_num_reqs
        self.device = device
        start_ids = (
            []
            if reasoning_config is None
            else list(reasoning_config.reasoning_start_token_ids or [])
        )
        end_ids = (
            []
            if reasoning_config is None
            else list(reasoning_config.reasoning_end_token_ids or [])
        )
        natural_end_ids = (
            []
            if reasoning_config is None
            else list(reasoning_config.natural_reasoning_end_token_ids or [])
        )
        # Without a separate natural end marker, the forced end is the end.
        natural_end_ids = natural_end_ids or end_ids
        self.enabled = bool(start_ids and end_ids)
        if not self.enabled:
            return
        self.start_ids = start_ids
        self.natural_end_ids = natural_end_ids
        self.end_ids = end_ids
        self.tail_len = max(
            len(start_ids) - 1, len(natural_end_ids) - 1, len(end_ids) - 1, 1
        )

        # [max_num_reqs] thinking_token_budget, -1 = none.
        self.budget = torch.full(
            (max_num_reqs,), -1, dtype=torch.int32, device=device
        )
        # [max_num_reqs] reasoning tokens since the last start marker,
        # -1 = not in reasoning.
        self.count = torch.full(
            (max_num_reqs,), -1, dtype=torch.int32, device=device
        )
        # [max_num_reqs, tail_len] last committed tokens (oldest first).
        self.tail = torch.full(
            (max_num_reqs, self.tail_len), -1, dtype=torch.int32, device=device
        )
        # [1] tokens replaced so far (for metrics and tests; never synced here).
        self.num_fixed = torch.zeros(1, dtype=torch.int32, device=device)
        self.start_token_ids = torch.tensor(
            start_ids, dtype=torch.int32, device=device
        )
        self.natural_end_token_ids = torch.tensor(
            natural_end_ids, dtype=torch.int32, device=device
        )
        self.end_token_ids = torch.tensor(end_ids, dtype=torch.int32, device=device)
        # Host mirror, only used to skip the launch when no request has a budget.
        self.has_budget = np.zeros(max_num_reqs, dtype=bool)
        self._staged: list[list[int]] = []

    def add_request(
        self,
        req_idx: int,
        sampling_params: SamplingParams,
        token_ids: list[int] | np.ndarray,
    ) -> None:
        if not self.enabled:
            return
        budget = sampling_params.thinking_token_budget
        budget = -1 if budget is None else min(budget, _INT32_MAX)
        count = (
            get_reasoning_count(token_ids, self.start_ids, self.natural_end_ids)
            if budget >= 0
            else -1
        )
        tail = [int(t) for t in token_ids[-self.tail_len :]]
        tail = [-1] * (self.tail_len - len(tail)) + tail
        self._staged.append([req_idx, budget, count, *tail])
        self.has_budget[req_idx] = budget >= 0

    def apply_staged_writes(self) -> None:
        if not self.enabled or not self._staged:
            return
        rows = torch.tensor(
            self._staged, dtype=torch.int32, pin_memory=is_pin_memory_available()
        ).to(self.device, non_blocking=True)
        self._staged.clear()
        req_indices = rows[:, 0].long()
        self.budget.index_copy_(0, req_indices, rows[:, 1])
        self.count.index_copy_(0, req_indices, rows[:, 2])
        self.tail.index_copy_(0, req_indices, rows[:, 3:])

    def apply(
        self,
        sampled_token_ids: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
    ) -> None:
        """Fix `sampled_token_ids`, `num_sampled` and `num_rejected` in place."""
        if not self.enabled:
            return
        valid = idx_mapping_np[idx_mapping_np >= 0]
        if not np.any(self.has_budget[valid]):
            return
        apply_thinking_budget_guard(
            sampled_token_ids,
            num_sampled,
            num_rejected,
            idx_mapping,
            self.budget,
            self.count,
            self.tail,
            self.num_fixed,
            self.start_token_ids,
            self.natural_end_token_ids,
            self.end_token_ids,
        )


@triton.jit
def _load_history_token(row_ptr, tail_ptr, TAIL_LEN: tl.constexpr, pos, cur_pos, cur_tok):
    # Token at relative position `pos` of the request's history: pos >= 0 is
    # this step's sampled row, pos < 0 the committed tail, cur_pos the token
    # being decided.
    in_row = pos >= 0
    a = tl.load(row_ptr + tl.maximum(pos, 0)).to(tl.int32)
    b = tl.load(tail_ptr + TAIL_LEN + tl.minimum(tl.maximum(pos, -TAIL_LEN), -1))
    tok = tl.where(in_row, a, b)
    tok = tl.where(pos < -TAIL_LEN, -1, tok)
    return tl.where(pos == cur_pos, cur_tok, tok)


@triton.jit
def _thinking_budget_guard_kernel(
    # [num_reqs, num_speculative_steps + 1]
    sampled_ptr,
    sampled_stride,
    # [num_reqs]
    num_sampled_ptr,
    # [num_reqs]
    num_rejected_ptr,
    # [num_reqs]
    idx_mapping_ptr,
    # [max_num_reqs]
    budget_ptr,
    # [max_num_reqs]
    count_ptr,
    # [max_num_reqs, TAIL_LEN]
    tail_ptr,
    # [1]
    num_fixed_ptr,
    start_token_ids_ptr,
    natural_end_token_ids_ptr,
    end_token_ids_ptr,
    START_LEN: tl.constexpr,
    NATURAL_END_LEN: tl.constexpr,
    END_LEN: tl.constexpr,
    TAIL_LEN: tl.constexpr,
    TAIL_BLOCK: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    req_state_idx = tl.load(idx_mapping_ptr + batch_idx)
    if req_state_idx < 0:
        return
    budget = tl.load(budget_ptr + req_state_idx)
    if budget < 0:
        return

    num_sampled = tl.load(num_sampled_ptr + batch_idx)
    count = tl.load(count_ptr + req_state_idx)
    row_ptr = sampled_ptr + batch_idx * sampled_stride
    req_tail_ptr = tail_ptr + req_state_idx * TAIL_LEN
    num_kept = num_sampled
    num_fixed = num_sampled * 0
    last_tok = num_sampled * 0 - 1
    for i in range(0, num_sampled):
        if i < num_kept:
            tok = tl.load(row_ptr + i).to(tl.int32)
            # count >= budget >= 0: in reasoning and out of budget.
            if count >= budget:
                # Continue an already emitted prefix of the end sequence.
                end_prefix_len = 0
                for prefix_len in tl.static_range(1, END_LEN):
                    prefix_match = True
                    for j in tl.static_range(0, prefix_len):
                        actual = _load_history_token(
                            row_ptr, req_tail_ptr, TAIL_LEN, i - prefix_len + j, i, tok
                        )
                        expected = tl.load(end_token_ids_ptr + j)
                        prefix_match = prefix_match & (actual == expected)
                    end_prefix_len = tl.where(prefix_match, prefix_len, end_prefix_len)
                force_token_id = tl.load(end_token_ids_ptr + end_prefix_len)
                if tok != force_token_id:
                    tl.store(
                        row_ptr + i, force_token_id.to(sampled_ptr.dtype.element_ty)
                    )
                    tok = force_token_id
                    num_kept = i + 1
                    num_fixed = num_fixed + 1
            # Advance the reasoning state over the kept token.
            count = tl.where(count >= 0, count + 1, count)
            start_match = True
            for j in tl.static_range(0, START_LEN):
                actual = _load_history_token(
                    row_ptr, req_tail_ptr, TAIL_LEN, i - START_LEN + 1 + j, i, tok
                )
                expected = tl.load(start_token_ids_ptr + j)
                start_match = start_match & (actual == expected)
            count = tl.where(start_match, 0, count)
            end_match = True
            for j in tl.static_range(0, NATURAL_END_LEN):
                actual = _load_history_token(
                    row_ptr, req_tail_ptr, TAIL_LEN, i - NATURAL_END_LEN + 1 + j, i, tok
                )
                expected = tl.load(natural_end_token_ids_ptr + j)
                end_match = end_match & (actual == expected)
            # A natural end ends reasoning unless the last start lies inside it.
            ends = end_match & (count >= 0) & (count + START_LEN >= NATURAL_END_LEN)
            count = tl.where(ends, -1, count)
            last_tok = tok

    tl.store(count_ptr + req_state_idx, count)
    if num_fixed > 0:
        tl.store(num_sampled_ptr + batch_idx, num_kept)
        num_rej = tl.load(num_rejected_ptr + batch_idx)
        tl.store(num_rejected_ptr + batch_idx, num_rej + num_sampled - num_kept)
        tl.atomic_add(num_fixed_ptr, num_fixed)
    if num_kept > 0:
        # New tail: the last TAIL_LEN tokens of (old tail ++ kept tokens).
        offs = tl.arange(0, TAIL_BLOCK)
        pos = num_kept - TAIL_LEN + offs
        mask = offs < TAIL_LEN
        a = tl.load(row_ptr + tl.maximum(pos, 0), mask=mask & (pos >= 0), other=-1)
        b = tl.load(
            req_tail_ptr + TAIL_LEN + tl.minimum(pos, -1),
            mask=mask & (pos < 0),
            other=-1,
        )
        new_tail = tl.where(pos >= 0, a.to(tl.int32), b)
        new_tail = tl.where(pos == num_kept - 1, last_tok, new_tail)
        tl.debug_barrier()
        tl.store(req_tail_ptr + offs, new_tail, mask=mask)


def apply_thinking_budget_guard(
    sampled_token_ids: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    idx_mapping: torch.Tensor,
    budget: torch.Tensor,
    count: torch.Tensor,
    tail: torch.Tensor,
    num_fixed: torch.Tensor,
    start_token_ids: torch.Tensor,
    natural_end_token_ids: torch.Tensor,
    end_token_ids: torch.Tensor,
) -> None:
    num_reqs = idx_mapping.shape[0]
    tail_len = tail.shape[1]
    _thinking_budget_guard_kernel[(num_reqs,)](
        sampled_token_ids,
        sampled_token_ids.stride(0),
        num_sampled,
        num_rejected,
        idx_mapping,
        budget,
        count,
        tail,
        num_fixed,
        start_token_ids,
        natural_end_token_ids,
        end_token_ids,
        START_LEN=start_token_ids.shape[0],
        NATURAL_END_LEN=natural_end_token_ids.shape[0],
        END_LEN=end_token_ids.shape[0],
        TAIL_LEN=tail_len,
        TAIL_BLOCK=max(2, triton.next_power_of_2(tail_len)),
        num_warps=1,
    )
