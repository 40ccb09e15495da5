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

The guard never reads `ThinkingBudgetState`, and nothing it decides *whether*
and *when* to force with comes from device memory a stray writer can
silently change (vLLM #54906: the marker tensors of `ThinkingBudgetState`
were found zeroed on the device, storage and `_version` unchanged):

- the marker ids are compile-time constants of the kernel;
- the host is the truth: per request slot it keeps the budget (from
  `SamplingParams`) and, for a request with a budget, its reasoning token
  count and the last few committed tokens, advanced from the tokens the guard
  itself kept (the kernel's "echo", read back without waiting);
- every launch passes one truth row per batch row (slot, budget, count,
  current, tail) through pinned memory with a non-blocking H2D copy;
- the device keeps the same state in three replicas (separate allocations),
  the kernel's working copy; the kernel checks them field by field against
  the truth row, rewrites any field that differs and counts one repair per
  request state (`num_repaired`, logged on the host from the echo).

A request the host says has no budget is never forced, whatever the device
holds. Under async scheduling the echo of the previous step may not have
landed when the next step launches; the truth row is then flagged not
`current` and the kernel takes count and tail (never the budget) from the
replicas' majority for that step.
"""

from collections import deque
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams
from vllm.triton_utils import tl, triton
from vllm.utils.platform_utils import is_pin_memory_available

if TYPE_CHECKING:
    from vllm.config.reasoning import ReasoningConfig

_INT32_MAX = np.iinfo(np.int32).max

# Columns of a truth row: slot | budget | count | current | tail[tail_len].
_T_SLOT, _T_BUDGET, _T_COUNT, _T_CURRENT, _T_TAIL = 0, 1, 2, 3, 4
# Columns of an echo row: kept | repaired | kept tokens[k + 1] (-1 padded).
_E_KEPT, _E_REPAIRED, _E_TOKENS = 0, 1, 2

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


def advance_reasoning_state(
    count: int,
    tail: list[int],
    token_ids: list[int],
    start_token_ids: tuple[int, ...],
    natural_end_token_ids: tuple[int, ...],
) -> tuple[int, list[int]]:
    """The kernel's walk on the host: (count, tail) after appending
    `token_ids` to a history whose reasoning count is `count` (-1: not in
    reasoning) and whose last `len(tail)` tokens are `tail`."""
    start, natural_end = list(start_token_ids), list(natural_end_token_ids)
    history = list(tail)
    for tok in token_ids:
        history.append(int(tok))
        if count >= 0:
            count += 1
        if history[-len(start) :] == start:
            count = 0
        # A natural end ends reasoning unless the last start lies inside it.
        if (
            history[-len(natural_end) :] == natural_end
            and count >= 0
            and count + len(start) >= len(natural_end)
        ):
            count = -1
    return count, history[len(history) - len(tail) :]


class _PendingEcho(NamedTuple):
    event: "torch.cuda.Event"
    echo: torch.Tensor  # host copy (pinned) of the step's echo
    slots: np.ndarray  # [num_rows] request slot of each row, -1: not guarded
    generations: np.ndarray  # [num_rows] slot generation at launch


class ThinkingBudgetGuard:
    """Per-request state of the commit-time thinking budget guard.

    Host (the truth, numpy, per request slot): `host_budget` (-1 = none),
    `host_count` (-1 = not in reasoning, or no budget), `host_tail`
    [max_num_reqs, tail_len] (last committed tokens, oldest first),
    `_generation` (bumped when a slot gets a new request: an echo of the
    slot's previous request is ignored) and `_num_pending` (echoes of the
    slot still on their way to the host).

    Device: three replicas of budget / count / tail (separate allocations),
    checked against the host's truth row and repaired by the kernel every
    guarded step; `num_fixed` (tokens replaced) and `num_repaired` (request
    states found different from the truth and repaired) counters.
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
        self._marker_ids = np.array(
            sorted(set(self.start_ids + self.natural_end_ids + self.end_ids)),
            dtype=np.int32,
        )
        self._pin_memory = is_pin_memory_available()

        # Host truth, per request slot.
        self.host_budget = np.full(max_num_reqs, -1, dtype=np.int32)
        self.host_count = np.full(max_num_reqs, -1, dtype=np.int32)
        self.host_tail = np.full((max_num_reqs, self.tail_len), -1, dtype=np.int32)
        self._generation = np.zeros(max_num_reqs, dtype=np.int64)
        self._num_pending = np.zeros(max_num_reqs, dtype=np.int32)
        self._pending: deque[_PendingEcho] = deque()
        self._staged: list[list[int]] = []

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
        # [1] request states that differed from the host's truth (repaired).
        self.num_repaired = torch.zeros(1, dtype=torch.int32, device=device)
        self._repaired_seen = 0
        self._repaired_warned = 0

    def _views(self, rep: torch.Tensor):
        n = self.max_num_reqs
        return rep[:n], rep[n : 2 * n], rep[2 * n :].view(n, self.tail_len)

    @property
    def has_budget(self) -> np.ndarray:
        """Host truth: which request slots hold a request with a budget."""
        return self.host_budget >= 0

    def add_request(
        self,
        req_idx: int,
        sampling_params: SamplingParams,
        token_ids: list[int] | np.ndarray,
    ) -> None:
        if not self.enabled:
            return
        budget = sampling_params.thinking_token_budget
        budget = -1 if budget is None or budget < 0 else min(budget, _INT32_MAX)
        count = (
            get_reasoning_count(
                token_ids, list(self.start_ids), list(self.natural_end_ids)
            )
            if budget >= 0
            else -1
        )
        tail = [int(t) for t in token_ids[-self.tail_len :]]
        tail = [-1] * (self.tail_len - len(tail)) + tail
        self._staged.append([req_idx, budget, count, *tail])
        self.host_budget[req_idx] = budget
        self.host_count[req_idx] = count
        self.host_tail[req_idx] = tail
        # Echoes of the slot's previous request no longer apply.
        self._generation[req_idx] += 1
        self._num_pending[req_idx] = 0

    def apply_staged_writes(self) -> None:
        if not self.enabled or not self._staged:
            return
        rows = torch.tensor(
            self._staged, dtype=torch.int32, pin_memory=self._pin_memory
        ).to(self.device, non_blocking=True)
        self._staged.clear()
        req_indices = rows[:, 0].long()
        for rep in self.replicas:
            budget, count, tail = self._views(rep)
            budget.index_copy_(0, req_indices, rows[:, 1])
            count.index_copy_(0, req_indices, rows[:, 2])
            tail.index_copy_(0, req_indices, rows[:, 3:])

    def apply(
        self,
        sampled_token_ids: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        idx_mapping_np: np.ndarray,
    ) -> None:
        """Fix `sampled_token_ids`, `num_sampled` and `num_rejected` in place.

        `idx_mapping_np` ([num_reqs], host) maps each batch row to its
        request slot (-1: padding). No host sync.
        """
        if not self.enabled:
            return
        self._absorb_landed_echoes()
        slots = np.asarray(idx_mapping_np, dtype=np.int32)
        valid = slots >= 0
        safe_slots = np.where(valid, slots, 0)
        budgets = np.where(valid, self.host_budget[safe_slots], -1)
        guarded = budgets >= 0
        if not guarded.any():
            return

        num_rows = slots.shape[0]
        truth = np.empty((num_rows, _T_TAIL + self.tail_len), dtype=np.int32)
        truth[:, _T_SLOT] = np.where(valid, slots, -1)
        truth[:, _T_BUDGET] = budgets
        truth[:, _T_COUNT] = np.where(guarded, self.host_count[safe_slots], -1)
        truth[:, _T_CURRENT] = self._num_pending[safe_slots] == 0
        truth[:, _T_TAIL:] = self.host_tail[safe_slots]
        truth_gpu = torch.from_numpy(truth)
        if self.device.type != "cpu":
            if self._pin_memory:
                truth_gpu = truth_gpu.pin_memory()
            truth_gpu = truth_gpu.to(self.device, non_blocking=True)

        k1 = sampled_token_ids.shape[1]
        echo = torch.empty(
            (num_rows, _E_TOKENS + k1), dtype=torch.int32, device=self.device
        )
        apply_thinking_budget_guard(
            sampled_token_ids,
            num_sampled,
            num_rejected,
            truth_gpu,
            echo,
            self.replicas,
            self.max_num_reqs,
            self.tail_len,
            self.num_fixed,
            self.num_repaired,
            self.start_ids,
            self.natural_end_ids,
            self.end_ids,
        )

        guarded_slots = np.where(guarded, slots, -1)
        generations = self._generation[safe_slots]
        if self.device.type == "cpu":
            # The kernel has run: advance the host truth at once.
            self._absorb(echo.numpy(), guarded_slots, generations)
            return
        # Read the echo back without waiting; absorbed on a later step.
        echo_cpu = torch.empty(
            echo.shape, dtype=echo.dtype, pin_memory=self._pin_memory
        )
        echo_cpu.copy_(echo, non_blocking=self._pin_memory)
        event = torch.cuda.Event()
        event.record()
        self._num_pending[slots[guarded]] += 1
        self._pending.append(_PendingEcho(event, echo_cpu, guarded_slots, generations))

    def _absorb_landed_echoes(self) -> None:
        while self._pending and self._pending[0].event.query():
            p = self._pending.popleft()
            live = (p.slots >= 0) & (
                self._generation[np.maximum(p.slots, 0)] == p.generations
            )
            self._num_pending[p.slots[live]] -= 1
            self._absorb(p.echo.numpy(), p.slots, p.generations)

    def _absorb(
        self, echo: np.ndarray, slots: np.ndarray, generations: np.ndarray
    ) -> None:
        """Advance the host truth over the tokens the guard kept."""
        num_repaired = int(echo[:, _E_REPAIRED].sum())
        if num_repaired:
            self._repaired_seen += num_repaired
            if self._repaired_seen >= 2 * self._repaired_warned:
                logger.warning(
                    "Thinking budget guard: %d per-request state(s) on the device "
                    "differed from the host's and were repaired (%d in total). "
                    "This is memory corruption.",
                    num_repaired,
                    self._repaired_seen,
                )
                self._repaired_warned = self._repaired_seen
        # Rows of a budgeted request still in its slot.
        rows = np.flatnonzero(
            (slots >= 0) & (self._generation[np.maximum(slots, 0)] == generations)
        )
        if rows.size == 0:
            return
        s = slots[rows]
        kept = echo[rows, _E_KEPT].astype(np.int64)
        tokens = echo[rows, _E_TOKENS:]
        in_kept = np.arange(tokens.shape[1])[None, :] < kept[:, None]
        has_marker = (np.isin(tokens, self._marker_ids) & in_kept).any(axis=1)
        # Rows without a marker token: count += kept (in reasoning), tail
        # shifted by the kept tokens.
        fast = ~has_marker
        if fast.any():
            fs, fk = s[fast], kept[fast]
            count = self.host_count[fs]
            self.host_count[fs] = np.where(count >= 0, count + fk, count)
            history = np.concatenate([self.host_tail[fs], tokens[fast]], axis=1)
            self.host_tail[fs] = np.take_along_axis(
                history, fk[:, None] + np.arange(self.tail_len)[None, :], axis=1
            )
        for i in np.flatnonzero(has_marker):
            slot, n = int(s[i]), int(kept[i])
            count, tail = advance_reasoning_state(
                int(self.host_count[slot]),
                self.host_tail[slot].tolist(),
                tokens[i, :n].tolist(),
                self.start_ids,
                self.natural_end_ids,
            )
            self.host_count[slot] = count
            self.host_tail[slot] = tail


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
    k1,
    # [num_reqs]
    num_sampled_ptr,
    # [num_reqs]
    num_rejected_ptr,
    # [num_reqs, 4 + TAIL_LEN] host truth: slot | budget | count | current | tail
    truth_ptr,
    truth_stride,
    # [num_reqs, 2 + k1] to the host: kept | repaired | kept tokens
    echo_ptr,
    echo_stride,
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
    K1_BLOCK: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    echo_row = echo_ptr + batch_idx * echo_stride
    koffs = tl.arange(0, K1_BLOCK)
    tl.store(echo_row + 0, 0)
    tl.store(echo_row + 1, 0)
    tl.store(
        echo_row + 2 + koffs,
        tl.full([K1_BLOCK], -1, tl.int32),
        mask=koffs < k1,
    )
    truth_row = truth_ptr + batch_idx * truth_stride
    req_state_idx = tl.load(truth_row + 0)
    if req_state_idx < 0:
        return
    # The budget is always the host's: whether and when this row is guarded.
    budget = tl.load(truth_row + 1)
    host_count = tl.load(truth_row + 2)
    current = tl.load(truth_row + 3) != 0
    has_budget = budget >= 0

    # Check the request's state in the three replicas against the truth. When
    # the host's count/tail lag (an earlier step's echo has not landed yet),
    # the replicas' majority stands in for them.
    count_off = max_num_reqs + req_state_idx
    tail_off = 2 * max_num_reqs + req_state_idx * TAIL_LEN
    offs = tl.arange(0, TAIL_BLOCK)
    tail_mask = offs < TAIL_LEN
    b0 = tl.load(rep0_ptr + req_state_idx)
    b1 = tl.load(rep1_ptr + req_state_idx)
    b2 = tl.load(rep2_ptr + req_state_idx)
    c0 = tl.load(rep0_ptr + count_off)
    c1 = tl.load(rep1_ptr + count_off)
    c2 = tl.load(rep2_ptr + count_off)
    t0 = tl.load(rep0_ptr + tail_off + offs, mask=tail_mask, other=-1)
    t1 = tl.load(rep1_ptr + tail_off + offs, mask=tail_mask, other=-1)
    t2 = tl.load(rep2_ptr + tail_off + offs, mask=tail_mask, other=-1)
    host_tail = tl.load(truth_row + 4 + offs, mask=tail_mask, other=-1)
    count = tl.where(
        has_budget, tl.where(current, host_count, _majority(c0, c1, c2)), -1
    )
    tail = tl.where(current, host_tail, _majority(t0, t1, t2))
    # The tail of a request without a budget is not tracked.
    tail_check = tail_mask & has_budget
    tail_bad = tl.sum(
        (((t0 != tail) | (t1 != tail) | (t2 != tail)) & tail_check).to(tl.int32),
        axis=0,
    )
    bad = (
        (b0 != budget)
        | (b1 != budget)
        | (b2 != budget)
        | (c0 != count)
        | (c1 != count)
        | (c2 != count)
        | (tail_bad > 0)
    )
    if bad:
        tl.store(rep0_ptr + req_state_idx, budget)
        tl.store(rep1_ptr + req_state_idx, budget)
        tl.store(rep2_ptr + req_state_idx, budget)
        tl.store(rep0_ptr + count_off, count)
        tl.store(rep1_ptr + count_off, count)
        tl.store(rep2_ptr + count_off, count)
        tl.store(rep0_ptr + tail_off + offs, tail, mask=tail_check)
        tl.store(rep1_ptr + tail_off + offs, tail, mask=tail_check)
        tl.store(rep2_ptr + tail_off + offs, tail, mask=tail_check)
        tl.atomic_add(num_repaired_ptr, 1)
        tl.store(echo_row + 1, 1)
    tl.debug_barrier()
    # A request the host says has no budget is never touched.
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
    tl.debug_barrier()
    # The echo: the kept tokens, which the host's truth advances over.
    kept = tl.load(row_ptr + koffs, mask=koffs < num_kept, other=-1).to(tl.int32)
    kept = tl.where(koffs == num_kept - 1, last_tok, kept)
    tl.store(echo_row + 2 + koffs, kept, mask=koffs < k1)
    tl.store(echo_row + 0, num_kept)
    if num_kept > 0:
        # New tail: the last TAIL_LEN tokens of (old tail ++ kept tokens).
        pos = num_kept - TAIL_LEN + offs
        a = tl.load(row_ptr + tl.maximum(pos, 0), mask=tail_mask & (pos >= 0), other=-1)
        b = tl.load(
            req_tail_ptr + TAIL_LEN + tl.minimum(pos, -1),
            mask=tail_mask & (pos < 0),
            other=-1,
        )
        new_tail = tl.where(pos >= 0, a.to(tl.int32), b)
        new_tail = tl.where(pos == num_kept - 1, last_tok, new_tail)
        tl.debug_barrier()
        tl.store(rep0_ptr + tail_off + offs, new_tail, mask=tail_mask)
        tl.store(rep1_ptr + tail_off + offs, new_tail, mask=tail_mask)
        tl.store(rep2_ptr + tail_off + offs, new_tail, mask=tail_mask)


def apply_thinking_budget_guard(
    sampled_token_ids: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    truth: torch.Tensor,
    echo: torch.Tensor,
    replicas: list[torch.Tensor],
    max_num_reqs: int,
    tail_len: int,
    num_fixed: torch.Tensor,
    num_repaired: torch.Tensor,
    start_token_ids: tuple[int, ...],
    natural_end_token_ids: tuple[int, ...],
    end_token_ids: tuple[int, ...],
) -> None:
    num_reqs, k1 = truth.shape[0], sampled_token_ids.shape[1]
    rep0, rep1, rep2 = replicas
    _thinking_budget_guard_kernel[(num_reqs,)](
        sampled_token_ids,
        sampled_token_ids.stride(0),
        k1,
        num_sampled,
        num_rejected,
        truth,
        truth.stride(0),
        echo,
        echo.stride(0),
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
        K1_BLOCK=max(2, triton.next_power_of_2(k1)),
        num_warps=1,
    )
