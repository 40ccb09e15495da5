# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tests for the MRV2 commit-time thinking budget guard.

Runs on CUDA, or on CPU tensors with TRITON_INTERPRET=1.
"""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.triton_utils import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="requires Triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (start, natural end, forced end) marker token ids
MARKERS = {
    "single": ([1], [3], [3]),
    "transition_phrase": ([1], [3], [5, 6, 3]),
    "multi_token": ([1, 2], [4, 3], [4, 3]),
    "overlapping": ([2, 1, 2], [3, 3], [5, 5, 3]),
}


def _ends_with(seq, sub):
    return len(seq) >= len(sub) and list(seq[len(seq) - len(sub) :]) == list(sub)


def _last_index(seq, sub):
    for i in range(len(seq) - len(sub), -1, -1):
        if list(seq[i : i + len(sub)]) == list(sub):
            return i
    return -1


def _reference_forced_token(history, budget, start, natural_end, end):
    """Token the thinking budget forces after `history`, or None."""
    last_start = _last_index(history, start)
    if last_start < 0 or last_start <= _last_index(history, natural_end):
        return None
    if len(history) - (last_start + len(start)) < budget:
        return None
    prefix = 0
    for p in range(1, len(end)):
        if _ends_with(history, end[:p]):
            prefix = p
    return end[prefix]


def _reference_guard(history, row, budget, start, natural_end, end):
    for i, tok in enumerate(row):
        forced = _reference_forced_token(
            list(history) + list(row[:i]), budget, start, natural_end, end
        )
        if forced is not None and tok != forced:
            return list(row[:i]) + [forced]
    return list(row)


def _random_history(rng, start):
    history = [rng.choice([0, 1, 2, 3, 4, 5, 6, 8]) for _ in range(rng.randint(1, 8))]
    if rng.random() < 0.8:
        history += start + [0] * rng.randint(0, 4)
    return history


def _random_row(rng, max_len):
    return [rng.choice([0, 0, 0, 1, 2, 3, 4, 5, 6]) for _ in range(rng.randint(0, max_len))]


def _make_guard(markers, max_num_reqs):
    from vllm.v1.worker.gpu.sample.thinking_budget_guard import ThinkingBudgetGuard

    start, natural_end, end = MARKERS[markers]
    config = SimpleNamespace(
        reasoning_start_token_ids=start,
        reasoning_end_token_ids=end,
        natural_reasoning_end_token_ids=natural_end,
    )
    return ThinkingBudgetGuard(max_num_reqs, torch.device(DEVICE), config)


@pytest.mark.parametrize("markers", sorted(MARKERS))
@pytest.mark.parametrize("seed", range(4))
def test_guard_matches_thinking_budget_kernel(markers, seed):
    """Each kept row equals what ThinkingBudgetState's own kernel forces."""
    from vllm.v1.worker.gpu.sample.thinking_budget import apply_thinking_budget

    start, natural_end, end = MARKERS[markers]
    rng = random.Random(seed)
    num_reqs, max_num_reqs, k1, vocab = 4, 8, 5, 16
    guard = _make_guard(markers, max_num_reqs)
    req_indices = rng.sample(range(max_num_reqs), num_reqs)
    histories = [_random_history(rng, start) for _ in range(num_reqs)]
    rows = [_random_row(rng, k1) for _ in range(num_reqs)]
    budgets = [rng.randint(0, 5) for _ in range(num_reqs)]
    for req_idx, history, budget in zip(req_indices, histories, budgets):
        params = SamplingParams(thinking_token_budget=budget)
        guard.add_request(req_idx, params, history)
    guard.apply_staged_writes()

    sampled = torch.full((num_reqs, k1), 7, dtype=torch.int64, device=DEVICE)
    for i, row in enumerate(rows):
        sampled[i, : len(row)] = torch.tensor(row)
    num_sampled = torch.tensor([len(r) for r in rows], dtype=torch.int32, device=DEVICE)
    num_rejected = (k1 - num_sampled).to(torch.int32)
    idx_mapping_np = np.array(req_indices, dtype=np.int32)
    guard.apply(sampled, num_sampled, num_rejected, idx_mapping_np)

    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    for i, (history, row, budget) in enumerate(zip(histories, rows, budgets)):
        # ThinkingBudgetState's kernel, one logits row per position of `row`
        # with the row's prefix as drafts.
        n = len(row)
        logits = torch.zeros(n, vocab, device=DEVICE)
        apply_thinking_budget(
            logits,
            i32([0]),
            i32([0] * n),
            i32([budget]),
            i32([history + [0] * (n + 8)]),
            i32([len(history)]),
            i32([history[-1]] + row[: n - 1])[:n],
            i32(list(range(n))),
            i32([-1]),
            i32([-1]),
            i32([0]),
            i32(start),
            i32(natural_end),
            i32(end),
        )
        expected = list(row)
        for j in range(n):
            forced = (logits[j] > 1e8).nonzero().flatten().tolist()
            if forced and row[j] != forced[0]:
                expected = row[:j] + [forced[0]]
                break
        num_kept = int(num_sampled[i])
        assert sampled[i, :num_kept].tolist() == expected
        assert int(num_rejected[i]) == k1 - len(expected)
        assert expected == _reference_guard(history, row, budget, start, natural_end, end)


@pytest.mark.parametrize("markers", sorted(MARKERS))
@pytest.mark.parametrize("num_speculative_steps", [0, 1, 4])
def test_guard_over_decode_steps(markers, num_speculative_steps):
    """Several steps of decoding: the state carried across steps stays exact."""
    start, natural_end, end = MARKERS[markers]
    rng = random.Random(num_speculative_steps * 7 + len(markers))
    num_reqs, max_num_reqs, k1 = 6, 8, num_speculative_steps + 1
    guard = _make_guard(markers, max_num_reqs)
    req_indices = rng.sample(range(max_num_reqs), num_reqs)
    histories = [_random_history(rng, start) for _ in range(num_reqs)]
    # One request without a budget: never touched.
    budgets = [rng.randint(0, 6) for _ in range(num_reqs - 1)] + [None]
    for req_idx, history, budget in zip(req_indices, histories, budgets):
        guard.add_request(req_idx, SamplingParams(thinking_token_budget=budget), history)
    guard.apply_staged_writes()
    idx_mapping_np = np.array(req_indices + [-1], dtype=np.int32)  # plus padding
    num_fixed_total = 0
    for _ in range(8):
        rows = [_random_row(rng, k1) for _ in range(num_reqs + 1)]
        sampled = torch.full((num_reqs + 1, k1), 9, dtype=torch.int64, device=DEVICE)
        for i, row in enumerate(rows):
            sampled[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        num_sampled = torch.tensor(
            [len(r) for r in rows], dtype=torch.int32, device=DEVICE
        )
        num_rejected = (k1 - num_sampled).to(torch.int32)
        guard.apply(sampled, num_sampled, num_rejected, idx_mapping_np)
        for i, row in enumerate(rows):
            if i == num_reqs or budgets[i] is None:
                expected = list(row)
            else:
                expected = _reference_guard(
                    histories[i], row, budgets[i], start, natural_end, end
                )
                num_fixed_total += int(expected != list(row))
            assert sampled[i, : int(num_sampled[i])].tolist() == expected
            assert int(num_rejected[i]) == k1 - len(expected)
            if i < num_reqs:
                histories[i] += expected
        assert guard.num_fixed.tolist() == [num_fixed_total]
    for i, history in enumerate(histories):
        if budgets[i] is None:
            continue
        last_start = _last_index(history, start)
        in_reasoning = last_start >= 0 and last_start > _last_index(
            history, natural_end
        )
        count = len(history) - last_start - len(start) if in_reasoning else -1
        assert int(guard.count[req_indices[i]]) == count


def test_guard_disabled_without_markers():
    from vllm.v1.worker.gpu.sample.thinking_budget_guard import ThinkingBudgetGuard

    guard = ThinkingBudgetGuard(4, torch.device(DEVICE), None)
    assert not guard.enabled
    sampled = torch.zeros(2, 3, dtype=torch.int64, device=DEVICE)
    num_sampled = torch.full((2,), 3, dtype=torch.int32, device=DEVICE)
    guard.apply(sampled, num_sampled, num_sampled.clone(), np.zeros(2))
    assert num_sampled.tolist() == [3, 3]


def _zero_in_place(t: torch.Tensor) -> None:
    # A write that is not a PyTorch write to `t`: a raw alias of its storage
    # (storage, data pointer and _version of `t` stay unchanged).
    alias = torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.size(), t.stride()
    )
    alias.fill_(0)


def _run_step(guard, rows, idx_mapping_np):
    sampled = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    num_sampled = torch.full((len(rows),), len(rows[0]), dtype=torch.int32)
    num_sampled = num_sampled.to(DEVICE)
    num_rejected = torch.zeros_like(num_sampled)
    guard.apply(sampled, num_sampled, num_rejected, idx_mapping_np)
    return [sampled[i, : int(n)].tolist() for i, n in enumerate(num_sampled)]


@pytest.mark.parametrize("zeroed", [(0,), (1,), (2,), (0, 1, 2)])
@pytest.mark.parametrize("lagged", [False, True])
def test_guard_survives_zeroed_state_replicas(zeroed, lagged):
    """A stray device write that zeroes one replica of the guard's state, or
    all three (then the replicas agree on budget 0 everywhere): the host's
    truth decides. The budgeted request is forced where its budget binds, the
    request without a budget is not forced, and both repairs are counted.
    `lagged`: the host's count and tail lag behind (async scheduling, the
    echo not landed yet), so the replicas' majority stands in for them, but
    never for the budget."""
    start, natural_end, end = MARKERS["single"]
    guard = _make_guard("single", 4)
    # Slot 2: budget 3, two reasoning tokens so far. Slot 0: no budget, deep
    # in reasoning.
    guard.add_request(2, SamplingParams(thinking_token_budget=3), [0, *start, 0, 0])
    guard.add_request(0, SamplingParams(), [*start] + [0] * 9)
    guard.apply_staged_writes()
    for r in zeroed:
        _zero_in_place(guard.replicas[r])
    idx_mapping_np = np.array([2, 0], dtype=np.int32)
    if lagged:
        guard._num_pending[2] += 1
    kept = _run_step(guard, [[0, 0, 0], [0, 0, 0]], idx_mapping_np)
    # Only when all three replicas were zeroed inside the lag window is the
    # count wrong for that one step (0 instead of 2): nothing is forced yet.
    window = lagged and len(zeroed) == 3
    assert kept == [[0, 0, 0] if window else [0, end[0]], [0, 0, 0]]
    assert guard.num_repaired.tolist() == [2]
    assert guard.num_fixed.tolist() == [0 if window else 1]
    for rep in guard.replicas:  # repaired and advanced alike in all three
        budget, count, _ = guard._views(rep)
        assert budget[[2, 0]].tolist() == [3, -1]
        assert count[[2, 0]].tolist() == [3 if window else -1, -1]
    if lagged:
        guard._num_pending[2] -= 1
    if DEVICE == "cuda":
        torch.cuda.synchronize()  # the echo has landed: the truth is current
    # Next step with a current truth: the window's count is repaired (2 + 3
    # reasoning tokens, out of budget), the request without budget untouched.
    kept = _run_step(guard, [[0, 0], [0, 0]], idx_mapping_np)
    assert kept == [[end[0]] if window else [0, 0], [0, 0]]
    assert guard.num_repaired.tolist() == [3 if window else 2]
    assert int(guard.count[2]) == -1
