"""The budget guard: enforce ``thinking_token_budget`` on the tokens MRV2 is about to commit.

vLLM enforces the thinking budget *before* sampling: ``ThinkingBudgetState.apply`` writes 1e9
into the end-marker column of the logits rows where the budget binds. Anything between that
write and the committed token (a fast path that skips logits processing, a disabled or
unregistered ``ThinkingBudgetState``, a stale device view of its UVA-backed budget, a sampler
that ignores the processed logits, synthetic acceptance, a frozen CUDA graph ...) can lose the
forcing, and #54906 is exactly such a loss. The guard checks the *result* instead: after
``GPUModelRunner.sample`` returned the step's tokens (Sampler or RejectionSampler, with or
without drafts) and before ``sample_tokens`` creates the ``AsyncOutput``, commits them
(``postprocess_sampled``) and lets the speculator propose from them, one Triton kernel walks
each request's sampled tokens with vLLM's own budget semantics and, at the first position where
the budget binds and the token is not the due end-marker token, writes that token, truncates
``num_sampled`` there and counts the dropped tokens as rejected (exactly what a rejected draft
looks like to the rest of MRV2). No sampling path can bypass it because it runs on what will
be committed.

Semantics (``vllm/v1/worker/gpu/sample/thinking_budget.py``): for a position whose history
(tokens before it) has ``n`` tokens after the last reasoning start marker, and no natural end
marker after that start, the budget binds when ``n >= budget``; the token there must be
``end_ids[p]`` where ``p`` is the longest proper prefix of ``end_ids`` the history already ends
with. A natural end before the boundary ends enforcement; multi-token end strings continue.

Processing order, per engine step:

1. ``add_requests`` (after vLLM's): for each new request read
   ``sampling_params.thinking_token_budget`` itself (never vLLM's ``ThinkingBudgetState``), its
   slot ``req_states.req_id_to_index[req_id]`` and ``prefill_token_ids``; compute on the host,
   once, the reasoning count at the end of that history and its last ``TAIL`` tokens; stage
   them and scatter all staged rows into the guard's own device tensors with one non-blocking
   H2D copy (plain tensors, deliberately not vLLM's ``UvaBackedTensor``).
2. ``sample`` (after vLLM's): if a request of the batch has a budget (host mirror, no sync),
   launch ``_budget_guard_kernel`` once, one program per request of ``input_batch.idx_mapping``.
   It first validates each request's per-slot state (majority of three replicas, repaired and
   counted when they disagree), then fixes ``sampled_token_ids`` / ``num_sampled`` /
   ``num_rejected`` in place, advances the per-slot count and tail over the tokens finally kept,
   and adds the number of replaced tokens in ``last_fixed`` (device, per batch row of this step)
   and ``total_fixed``.

Robust against a stray device writer (#54906: vLLM's marker tensors were zeroed during start-up
by something that is not a PyTorch write to them): the marker ids are ``tl.constexpr`` tuples
compiled into the kernel, the per-slot state is triple-redundant and validated every guarded
step (``GuardState``), and a disagreement becomes a warning on vLLM's logger.

What it deliberately does not do: touch logits (so logprobs of a replaced token are those of
the token vLLM had sampled), read or repair vLLM's budget state or its committed token history,
guard requests that were added while it was not installed, sync the host on the hot path, or
run anything per request in Python per step. It does not make vLLM's own forcing redundant on
healthy vLLM: there the kernel finds nothing to fix and outputs are token-identical.

Public API: ``install()`` / ``remove()`` / ``with enabled():``, ``patch_set()`` (the
``PatchSet`` named "guard", layer "guard"), ``state(runner)`` (the ``GuardState`` on a runner,
``runner._workbook_guard``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Sequence

import numpy as np
import torch

from workbook.core import budget
from workbook.vllm.patching import PatchSet

ATTR = "_workbook_guard"  # GuardState lives on the runner instance under this name
_INT32_MAX = int(np.iinfo(np.int32).max)

_patch_set: PatchSet | None = None
_generation = 0  # bumped on every install(): state staged under an older install is dropped


# ----------------------------------------------------------------------------------------------
# host side: the reasoning state at the end of a token history (once per request), from the one
# budget rule of ``workbook.core.budget`` (the kernel below is its device twin)

def reasoning_count(history: Sequence[int], markers: budget.Markers) -> int:
    """``budget.reasoning_count`` in the kernel's encoding: -1 when not in reasoning."""
    n = budget.reasoning_count(list(history), markers)
    return -1 if n is None else n


class GuardState:
    """Per-runner guard state: the guard's own device tensors and the host staging area.

    Nothing the kernel decides with lives in memory a stray device writer can silently change
    (vLLM #54906: ``ThinkingBudgetState``'s marker tensors were found zeroed on the device,
    storage and ``_version`` unchanged):

    - the marker ids (start, natural end, end) are compile-time constants of the kernel
      (``tl.constexpr`` tuples: one specialization per marker tuple), never device tensors;
    - the per-slot state is kept in three replicas, each its own allocation
      (``replicas[k]``: flat int32 ``[max_num_reqs * (2 + TAIL)]`` =
      budget ``[max_num_reqs]`` | count ``[max_num_reqs]`` | tail ``[max_num_reqs, TAIL]``):

        budget  thinking_token_budget, -1 = none
        count   reasoning tokens since the last start marker, -1 = not in reasoning (no
                start, or a natural end followed it)
        tail    the last TAIL committed tokens, oldest first, -1 padded; the end-sequence
                progress (longest emitted prefix of the end ids) is derived from it

      Every step, for every request of a guarded batch, the kernel reads the three replicas,
      takes the majority of each field, writes the repaired value back to all three when they
      disagreed and counts the slot in ``repaired_total``; the host turns a new count into a
      warning (``check_repairs``, read every ``CHECK_EVERY`` guarded steps, never per step).

    ``budget`` / ``count`` / ``tail`` are replica 0's views. Diagnostics: ``fixed_rows``
    [max_num_reqs] tokens replaced per batch row this step (first num_reqs), ``fixed_total`` [1]
    since creation, ``repaired_total`` [1] slots whose replicas disagreed.
    """

    CHECK_EVERY = 64

    def __init__(self, runner):
        self.markers = budget.Markers.of(getattr(runner.vllm_config, "reasoning_config", None))
        self.start_ids = list(self.markers.start)
        self.end_ids = list(self.markers.end)
        self.natural_end_ids = list(self.markers.natural_end)
        self.enabled = self.markers.complete
        self.device = runner.device
        self.max_num_reqs = int(runner.req_states.max_num_reqs)
        self.TAIL = max(len(self.start_ids) - 1, len(self.natural_end_ids) - 1,
                        len(self.end_ids) - 1, 1)
        self.generation = _generation
        n, d, i32 = self.max_num_reqs, self.device, torch.int32
        self.replicas = [_new_replica(n, self.TAIL, d) for _ in range(3)]
        self.budget, self.count, self.tail = _replica_views(self.replicas[0], n, self.TAIL)
        self.fixed_rows = torch.zeros(n, dtype=i32, device=d)  # [max_num_reqs]
        self.fixed_total = torch.zeros(1, dtype=i32, device=d)  # [1]
        self.repaired_total = torch.zeros(1, dtype=i32, device=d)  # [1]
        self._no_fix = torch.zeros(1, dtype=i32, device=d)  # last_fixed of a skipped step
        self._last_fixed = self._no_fix
        self.has_budget = np.zeros(n, dtype=bool)  # host mirror, only gates the launch
        self._staged: list[list[int]] = []  # rows [slot, budget, count, *tail]
        self.profile: list | None = None  # benchmark: set to [] to time each guarded step
        self.launches = 0
        self.repairs_seen = 0  # host copy of repaired_total at the last check

    # device views read by the tracer (no sync)
    @property
    def last_fixed(self) -> torch.Tensor:
        """Tokens replaced in the last step, per batch row ([num_reqs], or [1] zeros when the
        step had no request with a budget); sum it for the step's count."""
        return self._last_fixed

    @property
    def total_fixed(self) -> torch.Tensor:
        return self.fixed_total

    def reset(self) -> None:
        """Forget every slot (device fills, no sync)."""
        with torch.inference_mode():  # the tensors were made in vLLM's inference mode
            for rep in self.replicas:
                rep.fill_(-1)
        self.has_budget[:] = False
        self._staged.clear()
        self.generation = _generation

    # -- step 1: staging ------------------------------------------------------------------
    def stage(self, slot: int, budget: int | None, history: Sequence[int]) -> None:
        b = -1 if budget is None else min(int(budget), _INT32_MAX)
        cnt = reasoning_count(history, self.markers) if b >= 0 else -1
        tail = [int(t) for t in list(history)[-self.TAIL:]]
        tail = [-1] * (self.TAIL - len(tail)) + tail
        self._staged.append([int(slot), b, cnt, *tail])
        self.has_budget[slot] = b >= 0

    def flush(self) -> None:
        """Scatter the staged rows into the three replicas: one non-blocking H2D copy."""
        if not self._staged:
            return
        rows = torch.tensor(self._staged, dtype=torch.int32,
                            pin_memory=self.device.type == "cuda")  # [n_new, 3 + TAIL]
        self._staged = []
        rows = rows.to(self.device, non_blocking=True)
        slots = rows[:, 0].long()
        for rep in self.replicas:
            b, c, t = _replica_views(rep, self.max_num_reqs, self.TAIL)
            b.index_copy_(0, slots, rows[:, 1])
            c.index_copy_(0, slots, rows[:, 2])
            t.index_copy_(0, slots, rows[:, 3:])

    # -- step 2: enforcement --------------------------------------------------------------
    def enforce(self, sampler_output, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                input_batch) -> None:
        """Fix this step's sampled tokens in place (no host sync)."""
        self._last_fixed = self._no_fix
        idx_np = np.asarray(input_batch.idx_mapping_np)
        if not self.has_budget[idx_np[idx_np >= 0]].any():
            return
        sampled = sampler_output.sampled_token_ids  # [num_reqs, k+1]
        idx_mapping = input_batch.idx_mapping  # [num_reqs]
        num_reqs = idx_mapping.shape[0]
        if num_reqs == 0:
            return
        fixed_rows = self.fixed_rows[:num_reqs]
        launch(sampled, num_sampled, num_rejected, idx_mapping, self.replicas,
               self.max_num_reqs, self.TAIL, fixed_rows, self.fixed_total, self.repaired_total,
               self.markers)
        self._last_fixed = fixed_rows
        self.launches += 1
        if self.launches % self.CHECK_EVERY == 0:
            self.check_repairs()

    def check_repairs(self) -> int:
        """Read ``repaired_total`` (one sync); warn when replicas disagreed since the last
        check. Returns the total."""
        total = int(self.repaired_total.item())
        if total > self.repairs_seen:
            _log().warning(
                "workbook budget guard: %d per-slot state(s) changed outside the guard and were "
                "repaired from their replicas (%d in total) — device memory written by "
                "something else (vLLM #54906)", total - self.repairs_seen, total)
            self.repairs_seen = total
        return total


def _new_replica(max_num_reqs: int, tail_len: int, device) -> torch.Tensor:
    """One replica: flat int32 [max_num_reqs * (2 + tail_len)], all -1 (its own allocation)."""
    return torch.full((max_num_reqs * (2 + tail_len),), -1, dtype=torch.int32, device=device)


def _replica_views(rep: torch.Tensor, max_num_reqs: int, tail_len: int):
    """(budget [n], count [n], tail [n, tail_len]) views of a replica."""
    n = max_num_reqs
    return rep[:n], rep[n:2 * n], rep[2 * n:].view(n, tail_len)


def _log():
    import logging

    return logging.getLogger("vllm.workbook.guard")  # printed by vLLM's own handler


def _ids(x) -> tuple[int, ...]:
    """Marker ids as a tuple of Python ints (a tensor is read once: tests and benchmarks)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    return tuple(int(t) for t in x)


def launch(sampled, num_sampled, num_rejected, idx_mapping, replicas, max_num_reqs: int,
           tail_len: int, fixed_rows, fixed_total, repaired_total, markers) -> None:
    """One program per request row of ``sampled`` ([num_reqs, k+1]); see ``GuardState``.
    ``replicas``: three flat int32 tensors (``_new_replica`` layout); ``markers``: a
    ``budget.Markers`` (its ids become ``tl.constexpr`` tuples)."""
    _jit()
    from vllm.triton_utils import triton

    start, nat, end = _ids(markers.start), _ids(markers.natural_end), _ids(markers.end)
    if not (start and nat and end):
        raise ValueError(f"the guard needs start, natural-end and end ids, got {markers}")
    r0, r1, r2 = replicas
    _budget_guard_kernel[(idx_mapping.shape[0],)](
        sampled, sampled.stride(0), num_sampled, num_rejected, idx_mapping,
        r0, r1, r2, max_num_reqs, fixed_rows, fixed_total, repaired_total,
        START_IDS=start, NAT_END_IDS=nat, END_IDS=end,
        START_LEN=len(start), NAT_END_LEN=len(nat), END_LEN=len(end), TAIL=tail_len,
        TAIL_P2=max(2, triton.next_power_of_2(tail_len)), num_warps=1)


def launch_guard_kernel(sampled, num_sampled, num_rejected, idx_mapping, budget, count, tail,
                        fixed_rows, fixed_total, start_ids, natural_end_ids, end_ids,
                        repaired_total=None) -> None:
    """``launch`` over separate ``budget`` [n] / ``count`` [n] / ``tail`` [n, TAIL] tensors
    (one replica, packed and unpacked around the launch: tests and notebooks; the engine path
    is ``GuardState.enforce``)."""
    n, tail_len = budget.shape[0], tail.shape[1]
    rep = torch.cat([budget.reshape(-1), count.reshape(-1), tail.reshape(-1)]).to(torch.int32)
    reps = [rep, rep.clone(), rep.clone()]
    repaired = repaired_total if repaired_total is not None else \
        torch.zeros(1, dtype=torch.int32, device=budget.device)
    launch(sampled, num_sampled, num_rejected, idx_mapping, reps, n, tail_len, fixed_rows,
           fixed_total, repaired,
           budget_markers(start_ids, end_ids, natural_end_ids))
    b, c, t = _replica_views(rep, n, tail_len)
    budget.copy_(b)
    count.copy_(c)
    tail.copy_(t)


def budget_markers(start, end, natural_end) -> budget.Markers:
    return budget.Markers(_ids(start), _ids(end), _ids(natural_end))


# ----------------------------------------------------------------------------------------------
# the kernel
#
# ``_hist``, ``_vote`` and ``_budget_guard_kernel`` stay plain Python until the first launch:
# ``_jit()`` imports Triton through vLLM (after the CPU shim had its chance to set
# TRITON_INTERPRET) and rebinds the names, in this module's globals, to their ``triton.jit``
# versions, so that the kernel's calls resolve to the jitted helpers, compiled or interpreted.

tl: Any = None
_jitted = False


def _jit() -> None:
    global tl, _hist, _vote, _budget_guard_kernel, _jitted
    if _jitted:
        return
    from vllm.triton_utils import HAS_TRITON, tl as _tl, triton

    if not HAS_TRITON:
        raise RuntimeError("the budget guard needs Triton; vLLM disabled it in this process (on a"
                           " CPU: WORKBOOK_TRITON_CPU=1 / workbook.vllm.env.prepare_process before"
                           " vLLM is imported)")
    tl = _tl
    _hist = triton.jit(_hist)
    _vote = triton.jit(_vote)
    _budget_guard_kernel = triton.jit(_budget_guard_kernel)
    _jitted = True


def _hist(row_ptr, tail_ptr, TAIL: tl.constexpr, pos, cur_pos, cur_tok):
    # Token at relative position ``pos`` of the running history: pos >= 0 is this step's
    # row, pos < 0 the committed tail (TAIL + pos), pos == cur_pos the token being decided.
    in_row = pos >= 0
    a = tl.load(row_ptr + tl.maximum(pos, 0)).to(tl.int32)
    b = tl.load(tail_ptr + TAIL + tl.minimum(tl.maximum(pos, -TAIL), -1))
    tok = tl.where(in_row, a, b)
    tok = tl.where(pos < -TAIL, -1, tok)
    return tl.where(pos == cur_pos, cur_tok, tok)


def _vote(a, b, c):
    # Majority of three replicas (a when it agrees with one of the others, else b).
    return tl.where((a == b) | (a == c), a, b)


def _budget_guard_kernel(
    sampled_ptr,  # [num_reqs, k+1] tokens of this step, fixed in place
    sampled_stride,
    num_sampled_ptr,  # [num_reqs] int32, in place
    num_rejected_ptr,  # [num_reqs] int32, in place
    idx_mapping_ptr,  # [num_reqs] batch row -> slot (-1: padding)
    rep0_ptr,  # three replicas, each [max_reqs * (2 + TAIL)] int32:
    rep1_ptr,  # budget [max_reqs] | count [max_reqs] | tail [max_reqs, TAIL]
    rep2_ptr,
    max_reqs,
    fixed_rows_ptr,  # [num_reqs] int32, tokens replaced per row (written by every program)
    fixed_total_ptr,  # [1] int32
    repaired_ptr,  # [1] int32, slots whose replicas disagreed
    START_IDS: tl.constexpr,  # marker ids: compile-time constants, not device memory
    NAT_END_IDS: tl.constexpr,
    END_IDS: tl.constexpr,
    START_LEN: tl.constexpr,
    NAT_END_LEN: tl.constexpr,
    END_LEN: tl.constexpr,
    TAIL: tl.constexpr,
    TAIL_P2: tl.constexpr,
):
    req = tl.program_id(0)
    tl.store(fixed_rows_ptr + req, 0)
    slot = tl.load(idx_mapping_ptr + req)
    if slot < 0:
        return
    # validate the slot's state: majority of the three replicas, repaired where they disagree
    count_off = max_reqs + slot
    tail_off = 2 * max_reqs + slot * TAIL
    b0 = tl.load(rep0_ptr + slot)
    b1 = tl.load(rep1_ptr + slot)
    b2 = tl.load(rep2_ptr + slot)
    c0 = tl.load(rep0_ptr + count_off)
    c1 = tl.load(rep1_ptr + count_off)
    c2 = tl.load(rep2_ptr + count_off)
    offs = tl.arange(0, TAIL_P2)
    valid = offs < TAIL
    t0 = tl.load(rep0_ptr + tail_off + offs, mask=valid, other=-1)
    t1 = tl.load(rep1_ptr + tail_off + offs, mask=valid, other=-1)
    t2 = tl.load(rep2_ptr + tail_off + offs, mask=valid, other=-1)
    budget = _vote(b0, b1, b2)
    count = _vote(c0, c1, c2)
    tail = _vote(t0, t1, t2)
    t_bad = tl.sum(((t0 != t1) | (t0 != t2)).to(tl.int32), axis=0)
    bad = (b0 != b1) | (b0 != b2) | (c0 != c1) | (c0 != c2) | (t_bad > 0)
    if bad:
        tl.store(rep0_ptr + slot, budget)
        tl.store(rep1_ptr + slot, budget)
        tl.store(rep2_ptr + slot, budget)
        tl.store(rep0_ptr + count_off, count)
        tl.store(rep1_ptr + count_off, count)
        tl.store(rep2_ptr + count_off, count)
        tl.store(rep0_ptr + tail_off + offs, tail, mask=valid)
        tl.store(rep1_ptr + tail_off + offs, tail, mask=valid)
        tl.store(rep2_ptr + tail_off + offs, tail, mask=valid)
        tl.atomic_add(repaired_ptr, 1)
    tl.debug_barrier()
    if budget < 0:
        return
    n = tl.load(num_sampled_ptr + req)
    row_ptr = sampled_ptr + req * sampled_stride
    slot_tail_ptr = rep0_ptr + tail_off
    kept = n
    nfixed = n * 0
    last = n * 0 - 1
    for j in range(0, n):
        if j < kept:
            tok = tl.load(row_ptr + j).to(tl.int32)
            if count >= budget:  # budget >= 0, so count >= 0 here: in reasoning
                # end-sequence progress: longest proper prefix of END_IDS ending the history
                p = tok * 0
                for pl in tl.static_range(1, END_LEN):
                    match = True
                    for q in tl.static_range(0, pl):
                        h = _hist(row_ptr, slot_tail_ptr, TAIL, j - pl + q, j, tok)
                        match = match & (h == END_IDS[q])
                    p = tl.where(match, pl, p)
                forced = tok * 0 + END_IDS[0]
                for pl in tl.static_range(1, END_LEN):
                    forced = tl.where(p == pl, END_IDS[pl], forced)
                if tok != forced:
                    tl.store(row_ptr + j, forced.to(sampled_ptr.dtype.element_ty))
                    tok = forced
                    kept = j + 1
                    nfixed = nfixed + 1
            # advance the reasoning state over the kept token at position j
            count = tl.where(count >= 0, count + 1, count)
            s_match = True
            for q in tl.static_range(0, START_LEN):
                h = _hist(row_ptr, slot_tail_ptr, TAIL, j - START_LEN + 1 + q, j, tok)
                s_match = s_match & (h == START_IDS[q])
            count = tl.where(s_match, 0, count)
            e_match = True
            for q in tl.static_range(0, NAT_END_LEN):
                h = _hist(row_ptr, slot_tail_ptr, TAIL, j - NAT_END_LEN + 1 + q, j, tok)
                e_match = e_match & (h == NAT_END_IDS[q])
            # the natural end ends reasoning unless the last start lies inside it
            count = tl.where(e_match & (count >= 0) & (count + START_LEN >= NAT_END_LEN),
                             -1, count)
            last = tok
    tl.store(rep0_ptr + count_off, count)
    tl.store(rep1_ptr + count_off, count)
    tl.store(rep2_ptr + count_off, count)
    if nfixed > 0:
        tl.store(num_sampled_ptr + req, kept)
        rej = tl.load(num_rejected_ptr + req)
        tl.store(num_rejected_ptr + req, rej + (n - kept))
        tl.store(fixed_rows_ptr + req, nfixed)
        tl.atomic_add(fixed_total_ptr, nfixed)
    if kept > 0:
        # new tail = last TAIL tokens of (old tail ++ row[:kept])
        pos = kept - TAIL + offs
        a = tl.load(row_ptr + tl.maximum(pos, 0), mask=valid & (pos >= 0), other=-1)
        b = tl.load(slot_tail_ptr + TAIL + tl.minimum(pos, -1), mask=valid & (pos < 0),
                    other=-1)
        vals = tl.where(pos >= 0, a.to(tl.int32), b)
        vals = tl.where(pos == kept - 1, last, vals)
        tl.debug_barrier()
        tl.store(rep0_ptr + tail_off + offs, vals, mask=valid)
        tl.store(rep1_ptr + tail_off + offs, vals, mask=valid)
        tl.store(rep2_ptr + tail_off + offs, vals, mask=valid)


# ----------------------------------------------------------------------------------------------
# the wrappers and the patch set

def state(runner, *, create: bool = False) -> GuardState | None:
    """The runner's ``GuardState`` (created on demand); stale state from an earlier install is
    reset."""
    st = runner.__dict__.get(ATTR)
    if st is None:
        if not create:
            return None
        st = GuardState(runner)
        setattr(runner, ATTR, st)
    if st.generation != _generation:
        st.reset()
    return st


def _w_add_requests(orig):
    @functools.wraps(orig)
    def add_requests(self, scheduler_output, *args, **kwargs):
        out = orig(self, scheduler_output, *args, **kwargs)
        new_reqs = scheduler_output.scheduled_new_reqs
        st = state(self, create=bool(new_reqs))
        if st is None or not st.enabled:
            return out
        for new_req_data in new_reqs:
            sp = new_req_data.sampling_params
            budget = getattr(sp, "thinking_token_budget", None) if sp is not None else None
            slot = self.req_states.req_id_to_index[new_req_data.req_id]
            st.stage(slot, budget, new_req_data.prefill_token_ids or [])
        st.flush()
        return out

    return add_requests


def _w_sample(orig):
    @functools.wraps(orig)
    def sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
        out = orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
        st = state(self)
        if st is None or not st.enabled:
            return out
        sampler_output, num_sampled, num_rejected = out
        if st.profile is None:
            st.enforce(sampler_output, num_sampled, num_rejected, input_batch)
        else:
            _profiled_enforce(st, sampler_output, num_sampled, num_rejected, input_batch)
        return out

    return sample


def _profiled_enforce(st: GuardState, *args) -> None:
    """Benchmark path: record the guard's own time (CUDA events on a GPU, wall clock on CPU)."""
    if st.device.type == "cuda":
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host0 = time.perf_counter()
        t0.record()
        st.enforce(*args)
        t1.record()
        st.profile.append(("cuda", t0, t1, time.perf_counter() - host0))
    else:
        host0 = time.perf_counter()
        st.enforce(*args)
        st.profile.append(("cpu", None, None, time.perf_counter() - host0))


def patch_set() -> PatchSet:
    """The guard's ``PatchSet`` (built on first use; importing vLLM's runner module)."""
    global _patch_set
    if _patch_set is None:
        from workbook.vllm import hookpoints

        runner_cls = hookpoints.resolve().runner
        ps = PatchSet("guard", layer="guard")
        ps.wrap(runner_cls, "add_requests", _w_add_requests)
        ps.wrap(runner_cls, "sample", _w_sample)
        _patch_set = ps
    return _patch_set


def install() -> PatchSet:
    """Install the guard (idempotent). Requests added from now on are guarded."""
    global _generation
    ps = patch_set()
    if not ps.installed:
        _generation += 1
        ps.install()
    return ps


def remove() -> None:
    """Remove the guard; vLLM's methods are restored identically."""
    if _patch_set is not None:
        _patch_set.remove()


def installed() -> bool:
    return _patch_set is not None and _patch_set.installed


@contextlib.contextmanager
def enabled():
    """``with guard.enabled(): ...`` — installed inside, restored to the previous state after."""
    was = installed()
    install()
    try:
        yield patch_set()
    finally:
        if not was:
            remove()


def describe(runner) -> dict[str, Any]:
    """Small host-side summary for notebooks (syncs: not for the hot path)."""
    st = state(runner)
    if st is None:
        return {"installed": installed(), "state": None}
    return {"installed": installed(), "enabled": st.enabled, "start_ids": st.start_ids,
            "end_ids": st.end_ids, "natural_end_ids": st.natural_end_ids, "tail_len": st.TAIL,
            "slots_with_budget": int(st.has_budget.sum()),
            "total_fixed": int(st.total_fixed.item()), "repaired_total": st.check_repairs()}
