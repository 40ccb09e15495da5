# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ThinkingBudgetState keeps forcing when its marker tensors are overwritten.

vLLM #54906: with MRV2 + MTP the device tensors `reasoning_start_token_ids`,
`reasoning_end_token_ids` and `natural_reasoning_end_token_ids` read [0] after
start-up (storage and `_version` unchanged) and the budget was ignored. The
kernels now take the marker ids as compile-time constants, and
`check_markers()` reports (and repairs) an overwritten device copy.
"""

import inspect
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.sample.thinking_budget import (
    ThinkingBudgetState,
    apply_thinking_budget,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    # The CPU platform's MRV2 host buffers, as its worker installs them.
    import vllm.v1.worker.cpu.shm  # noqa: F401

START, END, VOCAB = 5, 6, 16  # <think>, </think>


def _zero_in_place(t: torch.Tensor) -> None:
    # Not a PyTorch write to `t`: a raw alias of its storage.
    alias = torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.size(), t.stride()
    )
    alias.fill_(0)


def _state(history: list[int], max_num_reqs: int = 4):
    all_token_ids = torch.zeros(max_num_reqs, 64, dtype=torch.int32, device=DEVICE)
    all_token_ids[0, : len(history)] = torch.tensor(history, dtype=torch.int32)
    total_len = torch.zeros(max_num_reqs, dtype=torch.int32, device=DEVICE)
    total_len[0] = len(history)
    req_states = SimpleNamespace(
        max_num_reqs=max_num_reqs,
        device=torch.device(DEVICE),
        all_token_ids=SimpleNamespace(gpu=all_token_ids),
        total_len=SimpleNamespace(gpu=total_len),
    )
    config = SimpleNamespace(
        reasoning_start_token_ids=[START],
        reasoning_end_token_ids=[END],
        natural_reasoning_end_token_ids=[END],
    )
    return ThinkingBudgetState(req_states, config)


def _apply(state: ThinkingBudgetState, logits: torch.Tensor, last_token: int):
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    idx_mapping_np = np.array([0], dtype=np.int32)
    args = dict(
        expanded_idx_mapping=i32([0]),
        idx_mapping=i32([0]),
        idx_mapping_np=idx_mapping_np,
        input_ids=i32([last_token]),
        expanded_local_pos=i32([0]),
    )
    params = list(inspect.signature(state.apply).parameters)
    if params[:2] == ["logits", "ctx"]:
        state.apply(logits, SimpleNamespace(**args))
    else:
        state.apply(
            logits,
            args["expanded_idx_mapping"],
            args["idx_mapping"],
            args["idx_mapping_np"],
            args["input_ids"],
            args["expanded_local_pos"],
        )


MARKERS = ("reasoning_start_token_ids", "reasoning_end_token_ids",
           "natural_reasoning_end_token_ids")


@pytest.mark.parametrize("zeroed", ["markers", "markers+caches"])
def test_forces_end_with_marker_storage_zeroed(zeroed):
    history = [1, 2, START, 3]  # one reasoning token after <think>
    state = _state(history)
    state.add_request(0, SamplingParams(thinking_token_budget=1))
    state.apply_staged_writes()
    for name in MARKERS:
        _zero_in_place(getattr(state, name))
    if zeroed == "markers+caches":
        _zero_in_place(state.cached_last_start)
        _zero_in_place(state.cached_last_end)
        _zero_in_place(state.cached_scan_pos)
    assert state.reasoning_start_token_ids.tolist() == [0]
    assert state.reasoning_start_token_ids._version == 0
    logits = torch.zeros(1, VOCAB, device=DEVICE)
    _apply(state, logits, history[-1])
    assert int(logits[0].argmax()) == END
    assert float(logits[0, END]) == pytest.approx(1e9)


def test_check_markers_warns_and_repairs(caplog):
    state = _state([1, START, 3])
    assert state.check_markers()
    assert state.check_markers()  # healthy: no warning, still no corruption
    assert state.num_marker_corruptions == 0
    _zero_in_place(state.reasoning_end_token_ids)
    with caplog.at_level(logging.WARNING):
        ok = state.check_markers()
        for _ in range(100):  # on CUDA the probe is read once its copy is done
            if not ok or state.num_marker_corruptions:
                break
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ok = state.check_markers()
    assert state.num_marker_corruptions == 1
    assert "overwritten" in caplog.text or state.num_marker_corruptions == 1
    assert state.reasoning_end_token_ids.tolist() == [END]  # repaired


def test_apply_thinking_budget_accepts_id_tuples_and_tensors():
    history = [START, 3, 3]
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    outs = []
    for ids in ((START,), i32([START])):
        logits = torch.zeros(1, VOCAB, device=DEVICE)
        end = (END,) if isinstance(ids, tuple) else i32([END])
        apply_thinking_budget(
            logits,
            i32([0]),
            i32([0]),
            i32([2]),
            i32([history + [0] * 8]),
            i32([len(history)]),
            i32([history[-1]]),
            i32([0]),
            i32([-1]),
            i32([-1]),
            i32([0]),
            ids,
            end,
            end,
        )
        outs.append(int(logits[0].argmax()))
    assert outs == [END, END]
