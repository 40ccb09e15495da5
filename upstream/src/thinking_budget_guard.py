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
non-blocking H2D copy. It never reads `ThinkingBudgetState`. It does not
depend on device memory a stray writer can silently change (vLLM #54906:
the marker tensors of `ThinkingBudgetState` were found zeroed on the device):
the marker ids are compile-time constants of its kernel, and its per-request
state is triple-redundant, validated and repaired by majority every step.
"""

from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams
from vllm.triton_utils import tl, triton
from vllm.utils.platform_utils import is_pin_memory_available

if TYPE_CHECKING:
    from vllm.config.reasoning import ReasoningConfig

_INT32_MAX = np.iinfo(np.int32).max

logger = init_logger(__name__)


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
    """Per-request state of the commit-time thinking budget guard.

    Nothing the kernel decides with can be silently changed by a stray
    device write: the marker ids are compile-time constants of the kernel
    (one specialization per marker tuple), and the per-request state is kept
    in three replicas (separate allocations) that the kernel validates and
    repairs by majority vote every step; a disagreement is counted in
    `num_repaired` and logged (read without a host sync).
    """

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
        self.start_ids = tuple(int(t) for t in start_ids)
        self.natural_end_ids = tuple(int(t) for t in natural_end_ids)
        self.end_ids = tuple(int(t) for t in end_ids)
        self.tail_len = max(
            len(start_ids) - 1, len(natural_end_ids) - 1, len(end_ids) - 1, 1
        )

        # Three replicas, each [max_num_reqs * (2 + tail_len)] int32:
        #   budget [max_num_reqs]  thinking_token_budget, -1 = none
        #   count  [max_num_reqs]  reasoning tokens since the last start
        #                          marker, -1 = not in reasoning
        #   tail   [max_num_reqs, tail_len]  last committed tokens (oldest
        #                          first)
        self.replicas = [
            torch.full(
                (max_num_reqs * (2 + self.tail_len),),
                -1,
                dtype=torch.int32,
                device=device,
            )
            for _ in range(3)
        ]
        self.budget, self.count, self.tail = self._views(self.replicas[0])
        # [1] tokens replaced so far (for metrics and tests; never synced here).
        self.num_fixed = torch.zeros(1, dtype=torch.int32, device=device)
        # [1] per-request states whose replicas disagreed (repaired).
        self.num_repaired = torch.zeros(1, dtype=torch.int32, device=device)
        self._repaired_seen = 0
        self._repair_probe: torch.Tensor | None = None
        self._repair_event: torch.cuda.Event | None = None
        # Host mirror, only used to skip the launch when no request has a budget.
        self.has_budget = np.zeros(max_num_reqs, dtype=bool)
        self._staged: list[list[int]] = []

    def _views(self, rep: torch.Tensor):
        n = self.max_num_reqs
        return rep[:n], rep[n : 2 * n], rep[2 * n :].view(n, self.tail_len)

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
            get_reasoning_count(token_ids, list(self.start_ids), list(self.natural_end_ids))
            if budget >= 0
            else -1
        )
        tail = [int(t) for t in token_ids[-self.tail_len :]]
        tail = [-1] * (self.tail_len - len(tail)) + tail
        self._staged.append([req_idx, budget, count, *tail])
        self.has_budget[req_idx] = budget >= 0

    def apply_staged_writes(self) -> None:
        if not self.enabled:
            return
        self._check_repairs()
        if not self._staged:
            return
        rows = torch.tensor(
            self._staged, dtype=torch.int32, pin_memory=is_pin_memory_available()
        ).to(self.device, non_blocking=True)
        self._staged.clear()
        req_indices = rows[:, 0].long()
        for rep in self.replicas:
            budget, count, tail = self._views(rep)
            budget.index_copy_(0, req_indices, rows[:, 1])
            count.index_copy_(0, req_indices, rows[:, 2])
            tail.index_copy_(0, req_indices, rows[:, 3:])

    def _check_repairs(self) -> None:
        # Sync-free: read num_repaired with a non-blocking copy, look at it on
        # a later step once the copy completed (at once on CPU).
        probe, event = self._repair_probe, self._repair_event
        if probe is not None and (event is None or event.query()):
            total = int(probe[0])
            if total > self._repaired_seen:
                logger.warning(
                    "Thinking budget guard: %d per-request state(s) were changed "
                    "on the device by something else and repaired from their "
                    "replicas (%d in total). This is memory corruption.",
                    total - self._repaired_seen,
                    total,
                )
                self._repaired_seen = total
            self._repair_probe = None
        if self._repair_probe is None:
            async_copy = self.num_repaired.is_cuda and is_pin_memory_available()
            probe = torch.empty(1, dtype=torch.int32, pin_memory=async_copy)
            probe.copy_(self.num_repaired, non_blocking=async_copy)
            self._repair_probe = probe
            self._repair_event = None
            if async_copy:
                self._repair_event = torch.cuda.Event()
                self._repair_event.record()

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
            self.replicas,
            self.max_num_reqs,
            self.tail_len,
            self.num_fixed,
            self.num_repaired,
            self.start_ids,
            self.natural_end_ids,
            self.end_ids,
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
def _majority(a, b, c):
    # a when it agrees with one of the other replicas, else b.
    return tl.where((a == b) | (a == c), a, b)


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
    # three replicas, each [max_num_reqs * (2 + TAIL_LEN)]:
    # budget [max_num_reqs] | count [max_num_reqs] | tail [max_num_reqs, TAIL_LEN]
    rep0_ptr,
    rep1_ptr,
    rep2_ptr,
    max_num_reqs,
    # [1]
    num_fixed_ptr,
    # [1]
    num_repaired_ptr,
    START_IDS: tl.constexpr,
    NATURAL_END_IDS: tl.constexpr,
    END_IDS: tl.constexpr,
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

    # Validate the request's state: majority of the three replicas.
    count_off = max_num_reqs + req_state_idx
    tail_off = 2 * max_num_reqs + req_state_idx * TAIL_LEN
    offs = tl.arange(0, TAIL_BLOCK)
    mask = offs < TAIL_LEN
    b0 = tl.load(rep0_ptr + req_state_idx)
    b1 = tl.load(rep1_ptr + req_state_idx)
    b2 = tl.load(rep2_ptr + req_state_idx)
    c0 = tl.load(rep0_ptr + count_off)
    c1 = tl.load(rep1_ptr + count_off)
    c2 = tl.load(rep2_ptr + count_off)
    t0 = tl.load(rep0_ptr + tail_off + offs, mask=mask, other=-1)
    t1 = tl.load(rep1_ptr + tail_off + offs, mask=mask, other=-1)
    t2 = tl.load(rep2_ptr + tail_off + offs, mask=mask, other=-1)
    budget = _majority(b0, b1, b2)
    count = _majority(c0, c1, c2)
    tail = _majority(t0, t1, t2)
    tail_bad = tl.sum(((t0 != t1) | (t0 != t2)).to(tl.int32), axis=0)
    bad = (b0 != b1) | (b0 != b2) | (c0 != c1) | (c0 != c2) | (tail_bad > 0)
    if bad:
        tl.store(rep0_ptr + req_state_idx, budget)
        tl.store(rep1_ptr + req_state_idx, budget)
        tl.store(rep2_ptr + req_state_idx, budget)
        tl.store(rep0_ptr + count_off, count)
        tl.store(rep1_ptr + count_off, count)
        tl.store(rep2_ptr + count_off, count)
        tl.store(rep0_ptr + tail_off + offs, tail, mask=mask)
        tl.store(rep1_ptr + tail_off + offs, tail, mask=mask)
        tl.store(rep2_ptr + tail_off + offs, tail, mask=mask)
        tl.atomic_add(num_repaired_ptr, 1)
    tl.debug_barrier()
    if budget < 0:
        return

    num_sampled = tl.load(num_sampled_ptr + batch_idx)
    row_ptr = sampled_ptr + batch_idx * sampled_stride
    req_tail_ptr = rep0_ptr + tail_off
    num_kept = num_sampled
    num_fixed = num_sampled * 0
    last_tok = num_sampled * 0 - 1
    for i in range(0, num_sampled):
        if i < num_kept:
            tok = tl.load(row_ptr + i).to(tl.int32)
            # count >= budget >= 0: in reasoning and out of budget.
            if count >= budget:
                # Continue an already emitted prefix of the end sequence.
                end_prefix_len = tok * 0
                for prefix_len in tl.static_range(1, END_LEN):
                    prefix_match = True
                    for j in tl.static_range(0, prefix_len):
                        actual = _load_history_token(
                            row_ptr, req_tail_ptr, TAIL_LEN, i - prefix_len + j, i, tok
                        )
                        prefix_match = prefix_match & (actual == END_IDS[j])
                    end_prefix_len = tl.where(prefix_match, prefix_len, end_prefix_len)
                force_token_id = tok * 0 + END_IDS[0]
                for k in tl.static_range(1, END_LEN):
                    force_token_id = tl.where(
                        end_prefix_len == k, END_IDS[k], force_token_id
                    )
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
                start_match = start_match & (actual == START_IDS[j])
            count = tl.where(start_match, 0, count)
            end_match = True
            for j in tl.static_range(0, NATURAL_END_LEN):
                actual = _load_history_token(
                    row_ptr, req_tail_ptr, TAIL_LEN, i - NATURAL_END_LEN + 1 + j, i, tok
                )
                end_match = end_match & (actual == NATURAL_END_IDS[j])
            # A natural end ends reasoning unless the last start lies inside it.
            ends = end_match & (count >= 0) & (count + START_LEN >= NATURAL_END_LEN)
            count = tl.where(ends, -1, count)
            last_tok = tok

    tl.store(rep0_ptr + count_off, count)
    tl.store(rep1_ptr + count_off, count)
    tl.store(rep2_ptr + count_off, count)
    if num_fixed > 0:
        tl.store(num_sampled_ptr + batch_idx, num_kept)
        num_rej = tl.load(num_rejected_ptr + batch_idx)
        tl.store(num_rejected_ptr + batch_idx, num_rej + num_sampled - num_kept)
        tl.atomic_add(num_fixed_ptr, num_fixed)
    if num_kept > 0:
        # New tail: the last TAIL_LEN tokens of (old tail ++ kept tokens).
        pos = num_kept - TAIL_LEN + offs
        a = tl.load(row_ptr + tl.maximum(pos, 0), mask=mask & (pos >= 0), other=-1)
        b = tl.load(
            req_tail_ptr + TAIL_LEN + tl.minimum(pos, -1),
            mask=mask & (pos < 0),
            other=-1,
        )
        new_tail = tl.where(pos >= 0, a.to(tl.int32), b)
        new_tail = tl.where(pos == num_kept - 1, last_tok, new_tail)
        tl.debug_barrier()
        tl.store(rep0_ptr + tail_off + offs, new_tail, mask=mask)
        tl.store(rep1_ptr + tail_off + offs, new_tail, mask=mask)
        tl.store(rep2_ptr + tail_off + offs, new_tail, mask=mask)


def apply_thinking_budget_guard(
    sampled_token_ids: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    idx_mapping: torch.Tensor,
    replicas: list[torch.Tensor],
    max_num_reqs: int,
    tail_len: int,
    num_fixed: torch.Tensor,
    num_repaired: torch.Tensor,
    start_token_ids: tuple[int, ...],
    natural_end_token_ids: tuple[int, ...],
    end_token_ids: tuple[int, ...],
) -> None:
    num_reqs = idx_mapping.shape[0]
    rep0, rep1, rep2 = replicas
    _thinking_budget_guard_kernel[(num_reqs,)](
        sampled_token_ids,
        sampled_token_ids.stride(0),
        num_sampled,
        num_rejected,
        idx_mapping,
        rep0,
        rep1,
        rep2,
        max_num_reqs,
        num_fixed,
        num_repaired,
        START_IDS=start_token_ids,
        NATURAL_END_IDS=natural_end_token_ids,
        END_IDS=end_token_ids,
        START_LEN=len(start_token_ids),
        NATURAL_END_LEN=len(natural_end_token_ids),
        END_LEN=len(end_token_ids),
        TAIL_LEN=tail_len,
        TAIL_BLOCK=max(2, triton.next_power_of_2(tail_len)),
        num_warps=1,
    )
