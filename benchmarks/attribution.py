"""Attribution on faults the catalogue does not hold: is the named cause the real one?

The diagnosis (``workbook.run.budget.diagnose``) was written from the stage contracts; the catalogue
faults (``workbook.hooks.faults.budget``) prove it on the faults written alongside it. This benchmark
measures it on *other* faults: written here, outside the catalogue, each breaking a stage in a
different way or through a different hook point than the catalogue fault of the same cause
(and several with no catalogue twin at all). Each is injected into healthy vLLM (MRV2 on CPU,
tiny dense MTP / EAGLE / ngram, k=4, drafts accepted: zeroed ``lm_head``), budgets 1, 3, 6 in
one batched generate call; every violated request is one case, scored against the cause the
fault really breaks:

- ``right``: the named hypothesis is the fault's;
- ``ambiguous``: several causes listed, the fault's among them;
- ``unclassified``: no name (the strongest anomalies listed);
- ``wrong``: a single name, another cause, or a list without it.

Each case is scored twice: the trace alone (``probes=False``) and after the automatic probes
(``workbook.run.budget.probes``, fed back with ``diagnose.with_probes``).

    PYTHONPATH=. .venv/bin/python benchmarks/attribution.py [--methods mtp eagle ngram]
        [--only NAME ...] [--out benchmarks/attribution.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from workbook.vllm import hookpoints, patching  # noqa: E402

MARKERS = ("reasoning_start_token_ids", "reasoning_end_token_ids",
           "natural_reasoning_end_token_ids")


def _tb_module(hp):
    return importlib.import_module(hp.budget.__module__)


# ---- the held-out faults: name -> (expected hypothesis, builder(ps, hp)) -----------------------

def numpy_marker_write(ps, hp):
    """The reporter's state through another door: at the first apply, the three marker tensors
    are zeroed through their numpy views (CPU memory written behind PyTorch's back)."""
    done = []

    def make(orig):
        def apply(state, *a, **k):
            if not done and getattr(state, "enabled", False):
                for n in MARKERS:
                    t = getattr(state, n)
                    done.append((t, t.numpy().copy()))
                    t.numpy()[:] = 0
            return orig(state, *a, **k)
        return apply

    def restore():
        for t, v in done:
            t.numpy()[:] = v
    ps.wrap(hp.budget, "apply", make)
    ps.on_remove(restore)


def end_marker_shifted(ps, hp):
    """Only the end-marker tensor is overwritten in place (through ``.data``) with another id:
    the kernel forces a wrong column because its state says so."""
    saved = []

    def make(orig):
        def apply(state, *a, **k):
            if not saved and getattr(state, "enabled", False):
                t = state.reasoning_end_token_ids
                saved.append((t, t.clone()))
                t.data.add_(7)
            return orig(state, *a, **k)
        return apply

    def restore():
        for t, v in saved:
            t.data.copy_(v)
    ps.wrap(hp.budget, "apply", make)
    ps.on_remove(restore)


def kernel_end_ids_swapped(ps, hp):
    """apply hands the kernel an end-id tensor of its own (end + 1): +1e9 in the next column."""
    mod = _tb_module(hp)

    def make(orig):
        def apply_thinking_budget(*a, **k):
            a = list(a)
            a[13] = a[13] + 1
            return orig(*a, **k)
        return apply_thinking_budget
    ps.wrap(mod, "apply_thinking_budget", make)


def bias_moved_after_apply(ps, hp):
    """After apply_sampling_params, every column >= 1e8 is moved one column down."""
    def make(orig):
        def apply_sampling_params(sampler, logits, *a, **k):
            out = orig(sampler, logits, *a, **k)
            if out is not logits:
                hit = out >= 1e8
                rows, cols = hit.nonzero(as_tuple=True)
                if rows.numel():
                    v = out[rows, cols].clone()
                    out[rows, cols] = 0.0
                    out[rows, (cols - 1) % out.shape[1]] = v
            return out
        return apply_sampling_params
    ps.wrap(hp.sampler, "apply_sampling_params", make)


def kernel_on_clone(ps, hp):
    """The kernel launch gets a clone of the logits: +1e9 lands in a tensor nobody samples."""
    mod = _tb_module(hp)

    def make(orig):
        def apply_thinking_budget(logits, *a, **k):
            return orig(logits.clone(), *a, **k)
        return apply_thinking_budget
    ps.wrap(mod, "apply_thinking_budget", make)


def bias_erased_in_place(ps, hp):
    """apply_sampling_params returns the biased tensor with the +1e9 entries erased in place."""
    def make(orig):
        def apply_sampling_params(sampler, logits, *a, **k):
            out = orig(sampler, logits, *a, **k)
            if out is not logits:
                out.masked_fill_(out >= 1e8, 0.0)
            return out
        return apply_sampling_params
    ps.wrap(hp.sampler, "apply_sampling_params", make)


def cache_forgets_start_at_staging(ps, hp):
    """Before each step's sampling (Sampler.apply_staged_writes), the marker cache of every
    budgeted slot says reasoning ended at the last committed token."""
    def make(orig):
        def apply_staged_writes(sampler, *a, **k):
            out = orig(sampler, *a, **k)
            st = sampler.thinking_budget_state
            if getattr(st, "enabled", False) and st.use_thinking_budget.any():
                import numpy as np
                import torch

                slots = torch.as_tensor(np.nonzero(st.use_thinking_budget)[0],
                                        device=st.cached_last_end.device)
                total = st.req_states.total_len.gpu[slots].to(torch.int32)
                started = st.cached_scan_pos[slots] > 0  # left alone before the first apply
                st.cached_last_end[slots] = torch.where(started, total - 1,
                                                        st.cached_last_end[slots])
                st.cached_scan_pos[slots] = torch.where(started, total,
                                                        st.cached_scan_pos[slots])
            return out
        return apply_staged_writes
    ps.wrap(hp.sampler, "apply_staged_writes", make)


def count_restarts_at_staging(ps, hp):
    """Before each step's sampling, the cached start of every budgeted slot jumps to the
    second-to-last committed token: the reasoning count restarts every step."""
    def make(orig):
        def apply_staged_writes(sampler, *a, **k):
            out = orig(sampler, *a, **k)
            st = sampler.thinking_budget_state
            if getattr(st, "enabled", False) and st.use_thinking_budget.any():
                import numpy as np
                import torch

                slots = torch.as_tensor(np.nonzero(st.use_thinking_budget)[0],
                                        device=st.cached_last_start.device)
                total = st.req_states.total_len.gpu[slots].to(torch.int32)
                started = st.cached_scan_pos[slots] > 0
                st.cached_last_start[slots] = torch.where(started, total - 2,
                                                          st.cached_last_start[slots])
                st.cached_scan_pos[slots] = torch.where(started, total,
                                                        st.cached_scan_pos[slots])
            return out
        return apply_staged_writes
    ps.wrap(hp.sampler, "apply_staged_writes", make)


def forcing_undone_for_later_requests(ps, hp):
    """The kernel runs, but only the batch's first request keeps its forcing (the others'
    end columns are restored): forcing depends on batch composition."""
    import numpy as np

    def make(orig):
        def apply(state, *a, **k):
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            if not getattr(state, "enabled", False) or np.asarray(args.idx_mapping_np).size < 2:
                return orig(state, *a, **k)
            ends = state.reasoning_end_token_ids.long()
            before = args.logits[:, ends].clone()
            out = orig(state, *a, **k)
            later = (args.expanded_idx_mapping != args.idx_mapping[0]).nonzero().flatten()
            if later.numel():
                args.logits[later.unsqueeze(1), ends.unsqueeze(0)] = before[later]
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def no_launch_when_batched(ps, hp):
    """apply skips its kernels whenever the batch holds more than one request."""
    import numpy as np

    def make(orig):
        def apply(state, *a, **k):
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            if np.asarray(args.idx_mapping_np).size > 1:
                return None
            return orig(state, *a, **k)
        return apply
    ps.wrap(hp.budget, "apply", make)


def last_token_replaced(ps, hp):
    """The rejection sampler's own last pick (bonus or recovered row) is replaced by token 0
    when it is the end token: the row was sampled from its forced logits, another token came
    out."""
    def make(orig):
        def __call__(rs, *a, **k):
            out = orig(rs, *a, **k)
            end = int(rs.sampler.thinking_budget_state.reasoning_end_token_ids[0])
            ids, ns = out.sampled_token_ids, out.num_sampled
            last = (ns.long() - 1).clamp(min=0)
            rows = ids.new_tensor(range(ids.shape[0])).long()
            pick = ids[rows, last]
            ids[rows, last] = ids.new_zeros(()).where(pick == end, pick)
            return out
        return __call__
    ps.wrap(hp.rejection, "__call__", make)


def host_budget_inflated(ps, hp):
    """Registration writes budget + 5 into the host (and device) budget."""
    def make(orig):
        def add_request(state, req_idx, sampling_params, *a, **k):
            out = orig(state, req_idx, sampling_params, *a, **k)
            if getattr(state, "enabled", False) and sampling_params.thinking_token_budget \
                    is not None:
                state.thinking_token_budget.np[req_idx] += 5
                state._budget_dirty = True
            return out
        return add_request
    ps.wrap(hp.budget, "add_request", make)


def budget_apply_shadowed(ps, hp):
    """apply_sampling_params runs with the state's apply shadowed by a no-op on the instance."""
    def make(orig):
        def apply_sampling_params(sampler, *a, **k):
            st = sampler.thinking_budget_state
            st.apply = lambda *x, **y: None
            try:
                return orig(sampler, *a, **k)
            finally:
                del st.apply
        return apply_sampling_params
    ps.wrap(hp.sampler, "apply_sampling_params", make)


def device_budget_cleared(ps, hp):
    """Before each step's sampling, the device view of the budget reads -1 (host untouched)."""
    def make(orig):
        def apply_staged_writes(sampler, *a, **k):
            out = orig(sampler, *a, **k)
            st = sampler.thinking_budget_state
            if getattr(st, "enabled", False):
                st.thinking_token_budget.gpu.fill_(-1)
            return out
        return apply_staged_writes
    ps.wrap(hp.sampler, "apply_staged_writes", make)


def kernel_total_len_short(ps, hp):
    """apply hands the kernel a total_len of its own, 3 tokens short (history view wrong)."""
    mod = _tb_module(hp)

    def make(orig):
        def apply_thinking_budget(*a, **k):
            a = list(a)
            a[5] = (a[5] - 3).clamp(min=0)
            return orig(*a, **k)
        return apply_thinking_budget
    ps.wrap(mod, "apply_thinking_budget", make)


def history_marker_erased(ps, hp):
    """After registration, the prompt's <think> in the device history (all_token_ids) is
    overwritten; the caches are reset, so the kernel's cold scan finds no start."""
    def make(orig):
        def add_requests(runner, scheduler_output, *a, **k):
            out = orig(runner, scheduler_output, *a, **k)
            st = runner.sampler.thinking_budget_state
            if not getattr(st, "enabled", False):
                return out
            start = int(st.reasoning_start_token_ids[0])
            for new in scheduler_output.scheduled_new_reqs:
                slot = runner.req_states.req_id_to_index[new.req_id]
                toks = list(new.prefill_token_ids or [])
                if start in toks:
                    p = len(toks) - 1 - toks[::-1].index(start)
                    runner.req_states.all_token_ids.gpu[slot, p] = 0
            return out
        return add_requests
    ps.wrap(hp.runner, "add_requests", make)


def accept_all_drafts(ps, hp):
    """rejection_sample accepts every draft (the last row's own argmax as the bonus)."""
    rmod = importlib.import_module(hp.rejection.__module__)

    def make(orig):
        def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, *a,
                             **k):
            sampled, num_sampled = orig(target_logits, draft_logits, draft_sampled,
                                        cu_num_logits, *a, **k)
            cu = cu_num_logits.tolist()
            for i in range(len(cu) - 1):
                lo, hi = cu[i], cu[i + 1]
                n = hi - lo
                if n <= 1:
                    continue
                sampled[i, :n - 1] = draft_sampled[lo + 1:hi]
                sampled[i, n - 1] = target_logits[hi - 1].argmax()
                num_sampled[i] = n
            return sampled, num_sampled
        return rejection_sample
    ps.wrap(rmod, "rejection_sample", make)


def budget_dropped_before_runner(ps, hp):
    """The runner receives the request without its thinking budget (dropped on the way)."""
    def make(orig):
        def add_requests(runner, scheduler_output, *a, **k):
            for new in scheduler_output.scheduled_new_reqs:
                if new.sampling_params is not None:
                    new.sampling_params.thinking_token_budget = None
            return orig(runner, scheduler_output, *a, **k)
        return add_requests
    ps.wrap(hp.runner, "add_requests", make)


def markers_rebound(ps, hp):
    """At the first apply, the state's start marker attribute is rebound to a new tensor [0]
    (a Python write: new storage)."""
    saved = []

    def make(orig):
        def apply(state, *a, **k):
            if not saved and getattr(state, "enabled", False):
                import torch

                saved.append((state, state.reasoning_start_token_ids))
                state.reasoning_start_token_ids = torch.zeros_like(
                    state.reasoning_start_token_ids)
            return orig(state, *a, **k)
        return apply

    def restore():
        for st, t in saved:
            st.reasoning_start_token_ids = t
    ps.wrap(hp.budget, "apply", make)
    ps.on_remove(restore)


def caches_zeroed_after_kernels(ps, hp):
    """Right after the budget kernels (inside apply), the marker caches of the batch are
    zeroed: the next step's cache says start 0, end 0 (not in reasoning)."""
    mod = _tb_module(hp)

    def make(orig):
        def apply_thinking_budget(logits, req_ids, *a, **k):
            out = orig(logits, req_ids, *a, **k)
            a = list(a)
            idx = req_ids.long()
            a[6][idx] = 0  # cached_last_start
            a[7][idx] = 0  # cached_last_end
            return out
        return apply_thinking_budget
    ps.wrap(mod, "apply_thinking_budget", make)


def budget_view_aliased(ps, hp):
    """At every apply, the device budget view is overwritten with -1 through a raw alias."""
    from workbook.hooks.faults.budget import raw_alias

    def make(orig):
        def apply(state, *a, **k):
            if getattr(state, "enabled", False):
                import torch

                with torch.inference_mode():
                    raw_alias(state.thinking_token_budget.gpu).fill_(-1)
            return orig(state, *a, **k)
        return apply
    ps.wrap(hp.budget, "apply", make)


def verify_on_raw_logits(ps, hp):
    """The rejection sampler verifies drafts against the unprocessed target logits (its
    _verify processes them, then hands rejection_sample the raw ones)."""
    rmod = importlib.import_module(hp.rejection.__module__)

    def make(orig):
        def _verify(rs, logits, *a, **k):
            real = rmod.rejection_sample

            def on_raw(processed, *x, **y):
                return real(logits.float(), *x, **y)
            rmod.rejection_sample = on_raw
            try:
                return orig(rs, logits, *a, **k)
            finally:
                rmod.rejection_sample = real
        return _verify
    ps.wrap(hp.rejection, "_verify", make)


def force_grid_first_row_only(ps, hp):
    """The forcing kernel is launched over the first logits row of the chunk only."""
    mod = _tb_module(hp)

    class Short:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return self.fn[(1,)]

        def __getattr__(self, name):
            return getattr(self.fn, name)

    ps.wrap(mod, "_thinking_budget_kernel", lambda orig: Short(orig))


# ---- issue #18: new kinds (the other side of the contract, the mapping, texts) --------------

def mapping_reversed_in_place(ps, hp):
    """Around sampling, the batch's device row->slot mapping (idx_mapping and
    expanded_idx_mapping) is reversed in place: request i's rows read request n-1-i's slot
    state (budget, history, caches); restored before the commit."""
    import torch

    def make(orig):
        def sample(runner, hidden_states, input_batch, *a, **k):
            idx, exp = input_batch.idx_mapping, input_batch.expanded_idx_mapping
            if idx.numel() < 2:
                return orig(runner, hidden_states, input_batch, *a, **k)
            saved = (idx.clone(), exp.clone())
            pos = (exp.unsqueeze(1) == idx.unsqueeze(0)).int().argmax(1)  # row -> request
            rev = idx.flip(0)
            with torch.inference_mode():
                exp.copy_(rev[pos])
                idx.copy_(rev)
            try:
                return orig(runner, hidden_states, input_batch, *a, **k)
            finally:
                with torch.inference_mode():
                    idx.copy_(saved[0])
                    exp.copy_(saved[1])
        return sample
    ps.wrap(hp.runner, "sample", make)


def draft_rows_forced_early(ps, hp):
    """After apply, every draft row (local position >= 1) of a budgeted request gets +1e9 at
    the end column, due or not: </think> forced before the budget binds."""
    def make(orig):
        def apply(state, *a, **k):
            out = orig(state, *a, **k)
            if getattr(state, "enabled", False):
                import torch

                args = hookpoints.budget_apply_args(hp.generation, a, k)
                use = torch.as_tensor(state.use_thinking_budget, device=args.logits.device)
                rows = ((args.expanded_local_pos > 0)
                        & use[args.expanded_idx_mapping.long()]).nonzero().flatten()
                if rows.numel():
                    end = state.reasoning_end_token_ids.long()[:1]
                    args.logits[rows.unsqueeze(1), end.unsqueeze(0)] = 1e9
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def forced_again_after_end(ps, hp):
    """After apply, every row of a budgeted request whose committed reasoning already ended
    (marker cache: last end after last start) gets +1e9 at the end column: forced twice."""
    def make(orig):
        def apply(state, *a, **k):
            out = orig(state, *a, **k)
            if getattr(state, "enabled", False):
                import torch

                args = hookpoints.budget_apply_args(hp.generation, a, k)
                slot = args.expanded_idx_mapping.long()
                use = torch.as_tensor(state.use_thinking_budget, device=args.logits.device)
                ended = state.cached_last_end[slot] > state.cached_last_start[slot]
                rows = (ended & use[slot]).nonzero().flatten()
                if rows.numel():
                    end = state.reasoning_end_token_ids.long()[:1]
                    args.logits[rows.unsqueeze(1), end.unsqueeze(0)] = 1e9
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def unbudgeted_registered_zero(ps, hp):
    """Registration gives a request without a budget the budget 0 (host and device)."""
    def make(orig):
        def add_request(state, req_idx, sampling_params, *a, **k):
            out = orig(state, req_idx, sampling_params, *a, **k)
            if getattr(state, "enabled", False) and \
                    sampling_params.thinking_token_budget is None:
                state.use_thinking_budget[req_idx] = True
                state.thinking_token_budget.np[req_idx] = 0
                state._budget_dirty = True
            return out
        return add_request
    ps.wrap(hp.budget, "add_request", make)


def unbudgeted_device_budget_zero(ps, hp):
    """Before each step's sampling, the device budget of every slot without a budget reads 0
    (host -1): the kernel forces requests that asked for none."""
    def make(orig):
        def apply_staged_writes(sampler, *a, **k):
            out = orig(sampler, *a, **k)
            st = sampler.thinking_budget_state
            if getattr(st, "enabled", False):
                import torch

                host = torch.as_tensor(st.thinking_token_budget.np,
                                       device=st.thinking_token_budget.gpu.device)
                dev = st.thinking_token_budget.gpu
                dev.copy_(torch.where(host < 0, torch.zeros_like(dev), dev))
            return out
        return apply_staged_writes
    ps.wrap(hp.sampler, "apply_staged_writes", make)


def unbudgeted_rows_forced(ps, hp):
    """After apply, the rows of requests without a budget get +1e9 at the end column (from
    their second step on): forced into a request with no budget."""
    seen: dict = {}

    def make(orig):
        def apply(state, *a, **k):
            out = orig(state, *a, **k)
            if getattr(state, "enabled", False):
                import numpy as np
                import torch

                args = hookpoints.budget_apply_args(hp.generation, a, k)
                slots = np.asarray(args.idx_mapping_np)
                free = [int(s) for s in slots if not state.use_thinking_budget[int(s)]]
                hit = [s for s in free if seen.get(s, 0) >= 1]
                for s in free:
                    seen[s] = seen.get(s, 0) + 1
                if hit:
                    mask = torch.zeros_like(args.expanded_idx_mapping, dtype=torch.bool)
                    for s in hit:
                        mask |= args.expanded_idx_mapping == s
                    rows = mask.nonzero().flatten()
                    end = state.reasoning_end_token_ids.long()[:1]
                    args.logits[rows.unsqueeze(1), end.unsqueeze(0)] = 1e9
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def weak_bias(ps, hp):
    """The forcing bias is +5 instead of +1e9, in rows whose top logit is 98.5 (token 0 raised
    to 98.5 first: alone harmless, healthy forcing wins by 1e9; vLLM rejects logit_bias with
    speculative decoding, so the strong logit is made here)."""
    def make(orig):
        def apply(state, *a, **k):
            if not getattr(state, "enabled", False):
                return orig(state, *a, **k)
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            args.logits[:, 0] += 98.5
            end = state.reasoning_end_token_ids.long()[:1]
            before = args.logits[:, end].clone()
            out = orig(state, *a, **k)
            hit = (args.logits[:, end] >= 1e8)[:, 0].nonzero().flatten()
            if hit.numel():
                args.logits[hit.unsqueeze(1), end.unsqueeze(0)] = before[hit] + 5.0
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def inband_end_marker_write(ps, hp):
    """At the second apply, the end-marker tensor is rewritten with copy_ (a tracked PyTorch
    write: _version moves) to another id."""
    n = {"apply": 0}
    saved = []

    def make(orig):
        def apply(state, *a, **k):
            if getattr(state, "enabled", False):
                n["apply"] += 1
                if n["apply"] == 2 and not saved:
                    import torch

                    t = state.reasoning_end_token_ids
                    saved.append((t, t.clone()))
                    with torch.inference_mode(False), torch.no_grad():
                        t.copy_(t + 2)
            return orig(state, *a, **k)
        return apply

    def restore():
        import torch

        for t, v in saved:
            with torch.no_grad():
                t.copy_(v)
    ps.wrap(hp.budget, "apply", make)
    ps.on_remove(restore)


# faults of issue #18 run on their own batch: (budgets, extra SamplingParams)
OPTIONS = {
    "unbudgeted_registered_zero": ([1, None, 6], {}),
    "unbudgeted_device_budget_zero": ([1, None, 6], {}),
    "unbudgeted_rows_forced": ([1, None, 6], {}),
    "weak_bias": ([1, 3, 6], {}),
    "mapping_reversed_in_place": ([1, 6, None], {}),
}


HELD_OUT = {
    "numpy_marker_write": ("H-i", numpy_marker_write),
    "end_marker_shifted": ("H-i", end_marker_shifted),
    "kernel_end_ids_swapped": ("H-d-column", kernel_end_ids_swapped),
    "bias_moved_after_apply": ("H-d-column", bias_moved_after_apply),
    "kernel_on_clone": ("H-e", kernel_on_clone),
    "bias_erased_in_place": ("H-e", bias_erased_in_place),
    "cache_forgets_start_at_staging": ("H-d-cache", cache_forgets_start_at_staging),
    "count_restarts_at_staging": ("H-d-cache", count_restarts_at_staging),
    "forcing_undone_for_later_requests": ("H-j", forcing_undone_for_later_requests),
    "no_launch_when_batched": ("H-j", no_launch_when_batched),
    "last_token_replaced": ("H-e-sample", last_token_replaced),
    "host_budget_inflated": ("H-c", host_budget_inflated),
    "budget_apply_shadowed": ("H-a", budget_apply_shadowed),
    "device_budget_cleared": ("H-d", device_budget_cleared),
    "kernel_total_len_short": ("H-d-kernel", kernel_total_len_short),
    "history_marker_erased": ("H-d-history", history_marker_erased),
    "accept_all_drafts": ("H-g", accept_all_drafts),
    "budget_dropped_before_runner": ("H-c", budget_dropped_before_runner),
    "markers_rebound": ("H-i-inband", markers_rebound),
    "caches_zeroed_after_kernels": ("H-d-cache", caches_zeroed_after_kernels),
    "budget_view_aliased": ("H-d", budget_view_aliased),
    "verify_on_raw_logits": ("H-e", verify_on_raw_logits),
    "force_grid_first_row_only": ("H-d-kernel", force_grid_first_row_only),
    # issue #18
    "mapping_reversed_in_place": ("H-j", mapping_reversed_in_place),
    "draft_rows_forced_early": ("H-d-kernel", draft_rows_forced_early),
    "forced_again_after_end": ("H-d-kernel", forced_again_after_end),
    "unbudgeted_registered_zero": ("H-c", unbudgeted_registered_zero),
    "unbudgeted_device_budget_zero": ("H-d", unbudgeted_device_budget_zero),
    "unbudgeted_rows_forced": ("H-d-kernel", unbudgeted_rows_forced),
    "weak_bias": ("H-d-kernel", weak_bias),
    "inband_end_marker_write": ("H-i-inband", inband_end_marker_write),
}
NEW_KINDS = tuple(list(HELD_OUT)[-8:])  # issue #18's


@contextlib.contextmanager
def injected(name: str):
    hp = hookpoints.resolve()
    ps = patching.PatchSet(f"held-out:{name}", "fault")
    HELD_OUT[name][1](ps, hp)
    ps.install()
    try:
        yield ps
    finally:
        ps.remove()


def score(expected: str, hyp: str | None, causes: list[dict]) -> str:
    names = {c["hypothesis"] for c in causes}
    if hyp == expected:
        return "right"
    if hyp == "ambiguous" and expected in names:
        return "ambiguous"
    if hyp == "unclassified":
        return "unclassified"
    return "wrong"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=["mtp", "eagle", "ngram"])
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--new-kinds", action="store_true", help="only issue #18's new kinds")
    ap.add_argument("--budgets", nargs="+", type=int, default=[1, 3, 6])
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(HERE, "attribution.json"))
    args = ap.parse_args(argv)

    from workbook.core.config import RunConfig
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose
    from workbook.run.budget import probes
    from workbook.vllm import engine as _engine

    cases = []
    for method in args.methods:
        eng = _engine.shared(RunConfig(spec_method=method))
        for name in args.only or (NEW_KINDS if args.new_kinds else list(HELD_OUT)):
            expected = HELD_OUT[name][0]
            budgets, params = OPTIONS.get(name, (args.budgets, {}))
            t0 = time.perf_counter()
            try:
                with injected(name):
                    with request.zeroed_lm_head(eng), Tracer() as t:
                        outs = request.run_budgets(eng, budgets, args.max_tokens, **params)
                    v = diagnose.diagnose(t.frames(), eng.effective, outs, eng.cfg)
                    per_req = {x["req_id"]: x for x in v["violations"]}
                    for vi in v["violations"]:
                        one = {**v, "first_violation": vi["first_violation"],
                               "causes": vi["causes"], "hypothesis": vi["hypothesis"],
                               "verdict": "violated"}
                        res = probes.run(eng, eng.cfg, one, zero_lm_head=True,
                                         max_tokens=args.max_tokens,
                                         **({"params": params} if params else {}))
                        after = diagnose.with_probes(one, res)
                        cases.append({
                            "fault": name, "expected": expected, "method": method,
                            "budget": vi["budget"], "kind": vi.get("kind"),
                            "step": vi["first_violation"]["step"],
                            "local_pos": vi["first_violation"]["local_pos"],
                            "trace": score(expected, vi["hypothesis"], vi["causes"]),
                            "named": vi["hypothesis"],
                            "causes": [c["hypothesis"] for c in vi["causes"]],
                            "probes": {n: p.get("verdict") for n, p in res.items()},
                            "probe_errors": {n: p["why"] for n, p in res.items()
                                             if not p.get("ran") and "Error" in
                                             str(p.get("why"))},
                            "with_probes": score(expected, after["hypothesis"], after["causes"]),
                            "named_after_probes": after["hypothesis"]})
                    if not per_req:
                        cases.append({"fault": name, "expected": expected, "method": method,
                                      "budget": None, "trace": "no violation",
                                      "with_probes": "no violation", "named": v["hypothesis"]})
            except Exception as e:  # a fault this code cannot run (older workbook API)
                cases.append({"fault": name, "expected": expected, "method": method,
                              "budget": None, "trace": "error", "with_probes": "error",
                              "named": f"{type(e).__name__}: {e}"[:200]})
            mine = [(c.get("budget"), c["named"], c.get("named_after_probes")) for c in cases
                    if c["fault"] == name and c["method"] == method]
            print(f"{method:6s} {name:36s} {expected:11s} {mine} "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
    summary = {"probes_crashed": sum(1 for c in cases if c.get("probe_errors"))}
    for key in ("trace", "with_probes"):
        counts: dict = {}
        for c in cases:
            counts[c[key]] = counts.get(c[key], 0) + 1
        summary[key] = counts
    by_fault = {}
    for c in cases:
        f = by_fault.setdefault(c["fault"], {"expected": c["expected"], "trace": {},
                                             "with_probes": {}})
        for key in ("trace", "with_probes"):
            f[key][c[key]] = f[key].get(c[key], 0) + 1
    with open(args.out, "w") as f:
        json.dump({"methods": args.methods, "faults": list(args.only or (
            NEW_KINDS if args.new_kinds else HELD_OUT)), "summary": summary,
            "by_fault": by_fault, "cases": cases}, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
