"""One removable fault per catalogue entry (``workbook.core.hypotheses``), injected by patching.

The bug of #54906 does not reproduce on healthy hardware, so the diagnosis is proven by making
healthy vLLM fail in each plausible way and checking that ``workbook.run.budget.diagnose`` names the way.
Each fault is a ``PatchSet`` of layer "fault" (innermost: the tracer sees its effects exactly as
it would see a broken vLLM) and is removed with ``.remove()``:

- ``H-a``  gate bypass: ``Sampler.add_request`` clears ``needs_logits_processing[slot]`` for
           greedy requests, so ``apply_sampling_params`` takes its fast path (pre-#52329 form).
- ``H-b``  ``ThinkingBudgetState.enabled`` reads False in the worker (as when the natural-end ids
           are missing from the reasoning config).
- ``H-c``  the request's budget never reaches ``ThinkingBudgetState.add_request`` (registered
           as "no budget").
- ``H-d``  stale device view: host writes of the budget never reach the device copy
           (``apply_staged_writes`` skips ``copy_to_uva`` of the budget).
- ``H-d-draft`` the budget kernel never forces draft rows (local position >= 1).
- ``H-e``  the row is forced, but the token is sampled from the unprocessed logits
           (``apply_sampling_params`` returns an FP32 copy of its input).
- ``H-f``  a decision frozen when it was first taken, as a captured graph would freeze it: the
           launch decision of ``ThinkingBudgetState.apply`` is the one of the warm-up batch,
           where no slot had a budget, so the kernels never launch.
- ``H-g``  synthetic acceptance: the rejection sampler accepts every draft without looking at
           the target row (``synthetic_conditional_rates`` all 1).
- ``H-h``  a V2 run silently served by V1: an environment fault, applied by
           ``workbook.vllm.env.vllm_env`` before vLLM starts (``VLLM_USE_V2_MODEL_RUNNER=0``
           while the configuration asks for V2). ``inject("H-h")`` only checks it was applied.
- ``H-i``  the reporter's measured state: right after start (at the first ``add_requests``),
           the state's three marker id tensors and its marker caches are zeroed in place
           through a raw alias on the same storage (``torch.Tensor.set_``), as an out-of-band
           writer would: storage and ``_version`` unchanged. Removal writes the saved values
           back the same way.
- ``H-i-inband`` the same marker tensors zeroed at the first ``add_requests`` by an ordinary
           PyTorch write (``fill_``: ``_version`` moves, storage unchanged): in band.
- ``H-d-cache``   after each commit, the marker cache of every budgeted slot of the batch
           forgets the start marker (``last_start = last_end = -1``, ``scan_pos = total_len``).
- ``H-d-restart`` after each commit, the marker cache moves the start to the last committed
           token (``last_start = total_len - 1``): the reasoning count restarts.
- ``H-d-column``  the budget's +1e9 lands in the column after the end token (the end column
           keeps its value).
- ``H-e-copy``    ``ThinkingBudgetState.apply`` forces a copy of the logits, never sampled.
- ``H-e-sample``  the sampler (gumbel) and the rejection sampler mask out every column holding
           >= 1e8 before sampling: forced rows yield their runner-up.
- ``H-j``  the budget kernels are launched with the batch's first request only (rows, slots,
           local positions cut to it): forcing depends on batch composition.
- ``H-k``  after sampling (before the guard, the commit and the speculator), every sampled
           end token becomes token 0.
- ``H-d-early`` / ``H-d-unbudgeted`` / ``H-d-twice``  the other side of the contract: after
           ``ThinkingBudgetState.apply``, +1e9 at the first end id in every draft row of a
           budgeted request (due or not), in every row of a request without a budget, or in
           every row of a budgeted request whose marker cache says reasoning already ended.
- ``H-i-profile`` / ``H-i-profile-mtp`` / ``H-i-step``  an out-of-band writer hidden in one
           module zeroes the budget state's markers and marker caches through a raw alias of
           their storage, during the profiling run (target or MTP drafter) or at real step
           ``STEP_N`` (end of this file; installed before the engine starts).

Not here: any knowledge used by the diagnosis (it never reads which fault was injected).
"""

from __future__ import annotations

import os
import weakref

from workbook.core import budget
from workbook.core.hypotheses import FAULTS
from workbook.vllm import hookpoints, patching

DESCRIPTIONS = {name: f.description for name, f in FAULTS.items()}
# faults for a running engine (and H-h); the start-up faults (``before_start``, H-i-*) are
# installed before the engine starts (``workbook.hooks.pre_start``)
FAULT_NAMES = tuple(n for n, f in FAULTS.items() if not f.before_start)


def hypothesis_of(fault: str) -> str:
    """The hypothesis a fault reproduces (``H-d-draft`` → ``H-d``)."""
    return FAULTS[fault].hypothesis


def inject(name: str, engine=None) -> patching.PatchSet:
    """Install fault ``name``; returns its patch set (``.remove()`` restores vLLM)."""
    if name not in DESCRIPTIONS:
        raise ValueError(f"unknown fault {name!r}; known: {list(DESCRIPTIONS)}")
    hp = hookpoints.resolve()
    ps = patching.PatchSet(f"fault:{name}", "fault")
    _BUILDERS[name](ps, hp)
    return ps.install()


def _h_a(ps, hp):
    def make(orig):
        def add_request(sampler, *a, **k):
            out = orig(sampler, *a, **k)
            req_idx, sp = hookpoints.sampler_add_request_params(hp.generation, a, k)
            if sp is not None and sp.temperature == 0.0:
                sampler.needs_logits_processing[req_idx] = False
            return out
        return add_request
    ps.wrap(hp.sampler, "add_request", make)


def _h_b(ps, hp):
    def make(_orig):
        return property(lambda self: False, lambda self, v: None)
    ps.wrap(hp.budget, "enabled", make, allow_new=True)


def _h_c(ps, hp):
    def make(orig):
        def add_request(state, req_idx, sampling_params, *a, **k):
            lost = sampling_params.clone() if hasattr(sampling_params, "clone") else None
            if lost is None:
                import copy
                lost = copy.copy(sampling_params)
            lost.thinking_token_budget = None
            return orig(state, req_idx, lost, *a, **k)
        return add_request
    ps.wrap(hp.budget, "add_request", make)


def _h_d(ps, hp):
    touched = weakref.WeakSet()

    def make(orig):
        def apply_staged_writes(state, *a, **k):
            if getattr(state, "enabled", False):
                if state not in touched:  # a device view that never saw a host write
                    touched.add(state)
                    state.thinking_token_budget.gpu.fill_(-1)
                state._budget_dirty = False  # the budget never reaches the device view
            return orig(state, *a, **k)
        return apply_staged_writes

    def resync():  # removal: the device view catches up with the host again
        for state in list(touched):
            state.thinking_token_budget.copy_to_uva()

    ps.wrap(hp.budget, "apply_staged_writes", make)
    ps.on_remove(resync)


def _h_d_draft(ps, hp):
    def make(orig):
        def apply(state, *a, **k):
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            if not getattr(state, "enabled", False):
                return orig(state, *a, **k)
            ends = state.reasoning_end_token_ids.long()
            before = args.logits[:, ends].clone()  # [rows, E]
            out = orig(state, *a, **k)
            draft = (args.expanded_local_pos > 0).nonzero().flatten()
            if draft.numel():
                rows = draft.unsqueeze(1)
                args.logits[rows, ends.unsqueeze(0)] = before[draft]
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def _h_e(ps, hp):
    import torch

    def make(orig):
        def apply_sampling_params(sampler, logits, *a, **k):
            orig(sampler, logits, *a, **k)  # the budget forces its rows ...
            return logits.to(torch.float32, copy=True)  # ... but sampling uses the raw logits
        return apply_sampling_params
    ps.wrap(hp.sampler, "apply_sampling_params", make)


def _h_f(ps, hp):
    frozen = {"launch": False}  # the warm-up batch had no slot with a budget

    def make(orig):
        def apply(state, *a, **k):
            if not frozen["launch"]:
                return None  # replay of the captured decision: no launch
            return orig(state, *a, **k)
        return apply
    ps.wrap(hp.budget, "apply", make)


def _h_g(ps, hp):
    import torch

    def make(orig):
        def __call__(rs, *a, **k):
            saved = rs.synthetic_conditional_rates
            k_steps = rs.num_speculative_steps
            dev = a[0].device if a else k["logits"].device
            rs.synthetic_conditional_rates = torch.ones(k_steps, dtype=torch.float32, device=dev)
            try:
                return orig(rs, *a, **k)
            finally:
                rs.synthetic_conditional_rates = saved
        return __call__
    ps.wrap(hp.rejection, "__call__", make)


def _h_h(ps, hp):
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") != "0":
        raise RuntimeError("fault H-h is applied at engine start (RunConfig(fault='H-h') makes "
                           "workbook.vllm.env set VLLM_USE_V2_MODEL_RUNNER=0); it cannot be "
                           "injected into a running engine")


MARKER_ATTRS = tuple(budget.KEYS.values())  # ThinkingBudgetState's marker-id tensors
CACHE_ATTRS = ("cached_last_start", "cached_last_end")


def raw_alias(t):
    """A tensor on ``t``'s storage that PyTorch does not know as ``t``: writes through it
    leave ``t._version`` (and ``t.data_ptr()``) unchanged, as an out-of-band writer would."""
    import torch

    with torch.inference_mode():
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(
            t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def raw_alias_zero(t) -> None:
    """Zero ``t``'s bytes through a raw alias of its storage (``_version`` unchanged)."""
    import torch

    with torch.inference_mode():
        raw_alias(t).fill_(0)  # the op the localization names (aten.fill_.Scalar)


def _h_i(ps, hp):
    import torch

    saved: list = []  # (state, attr, original values)

    def corrupt(state):
        for name in MARKER_ATTRS + CACHE_ATTRS:
            t = getattr(state, name)
            saved.append((state, name, t.detach().clone()))
            with torch.inference_mode():
                raw_alias(t).zero_()

    def make(orig):
        def add_requests(runner, *a, **k):
            st = getattr(getattr(runner, "sampler", None), "thinking_budget_state", None)
            if not saved and st is not None and getattr(st, "enabled", False):
                corrupt(st)
            return orig(runner, *a, **k)
        return add_requests

    def restore():
        with torch.inference_mode():
            for state, name, vals in saved:
                raw_alias(getattr(state, name)).copy_(vals)
        saved.clear()

    ps.wrap(hp.runner, "add_requests", make)
    ps.on_remove(restore)


def _h_i_inband(ps, hp):
    import torch

    saved: list = []  # (tensor, original values)

    def make(orig):
        def add_requests(runner, *a, **k):
            st = getattr(getattr(runner, "sampler", None), "thinking_budget_state", None)
            if not saved and st is not None and getattr(st, "enabled", False):
                with torch.no_grad():
                    for name in MARKER_ATTRS:
                        t = getattr(st, name)
                        saved.append((t, t.detach().clone()))
                        t.fill_(0)  # a tracked PyTorch write: t._version moves
            return orig(runner, *a, **k)
        return add_requests

    def restore():
        with torch.no_grad():
            for t, vals in saved:
                t.copy_(vals)
        saved.clear()

    ps.wrap(hp.runner, "add_requests", make)
    ps.on_remove(restore)


def _budgeted_slots(runner, idx_mapping):
    """Slots of ``idx_mapping`` with a budget (host arrays only), as a device index."""
    import numpy as np
    import torch

    st = runner.sampler.thinking_budget_state
    if not getattr(st, "enabled", False):
        return None, st
    slots = [int(s) for s in np.asarray(idx_mapping.cpu()) if s >= 0
             and st.use_thinking_budget[int(s)]]
    if not slots:
        return None, st
    return torch.tensor(slots, dtype=torch.long, device=st.cached_last_start.device), st


def _cache_fault(ps, hp, restart: bool):
    def make(orig):
        def postprocess_sampled(runner, idx_mapping, *a, **k):
            out = orig(runner, idx_mapping, *a, **k)
            idx, st = _budgeted_slots(runner, idx_mapping)
            if idx is not None:
                total = runner.req_states.total_len.gpu[idx].to(st.cached_scan_pos.dtype)
                st.cached_last_start[idx] = (total - 1) if restart else -1
                st.cached_last_end[idx] = -1
                st.cached_scan_pos[idx] = total
            return out
        return postprocess_sampled
    ps.wrap(hp.runner, "postprocess_sampled", make)


def _h_d_cache(ps, hp):
    _cache_fault(ps, hp, restart=False)


def _h_d_restart(ps, hp):
    _cache_fault(ps, hp, restart=True)


def _h_d_column(ps, hp):
    def make(orig):
        def apply(state, *a, **k):
            if not getattr(state, "enabled", False):
                return orig(state, *a, **k)
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            end = state.reasoning_end_token_ids.long()[:1]
            logits = args.logits
            before = logits[:, end].clone()
            out = orig(state, *a, **k)
            hit = (logits[:, end] >= 1e8) & (before < 1e8)  # [rows, 1]
            other = (end + 1) % logits.shape[-1]
            rows = hit[:, 0].nonzero().flatten()
            if rows.numel():
                logits[rows, other] = 1e9
                logits[rows, end] = before[rows, 0]
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def _h_e_copy(ps, hp):
    def make(orig):
        def apply(state, logits, *a, **k):
            return orig(state, logits.clone(), *a, **k)  # forced: a copy nobody samples
        return apply
    ps.wrap(hp.budget, "apply", make)


def _h_e_sample(ps, hp):
    import importlib

    def masked(logits):
        return logits.masked_fill(logits >= 1e8, float("-inf"))

    def make_first_arg(orig):
        def fn(logits, *a, **k):
            return orig(masked(logits), *a, **k)
        return fn

    smod = importlib.import_module(hp.sampler.__module__)
    rmod = importlib.import_module(hp.rejection.__module__)
    for mod, name in ((smod, "gumbel_sample"), (smod, "flashinfer_sample"),
                      (smod, "xpu_sample"), (rmod, "rejection_sample")):
        if callable(getattr(mod, name, None)):
            ps.wrap(mod, name, make_first_arg)


def _h_j(ps, hp):
    import numpy as np

    def make(orig):
        def apply(state, *a, **k):
            args = hookpoints.budget_apply_args(hp.generation, a, k)
            idx_np = np.asarray(args.idx_mapping_np)
            if idx_np.shape[0] <= 1 or not getattr(state, "enabled", False):
                return orig(state, *a, **k)
            # rows of the first request only: the grid sized from a batch of one
            n0 = int((args.expanded_idx_mapping == args.idx_mapping[0]).sum().item())
            cut = dict(logits=args.logits[:n0], expanded_idx_mapping=args.expanded_idx_mapping[
                :n0], idx_mapping=args.idx_mapping[:1], idx_mapping_np=idx_np[:1],
                input_ids=args.input_ids[:n0], expanded_local_pos=args.expanded_local_pos[:n0])
            if hp.generation == "0.31":
                import dataclasses

                ctx = a[1] if len(a) > 1 else k["ctx"]
                ctx2 = dataclasses.replace(ctx, **{f: cut[f] for f in (
                    "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "input_ids",
                    "expanded_local_pos")})
                return orig(state, cut["logits"], ctx2)
            return orig(state, cut["logits"], cut["expanded_idx_mapping"], cut["idx_mapping"],
                        cut["idx_mapping_np"], cut["input_ids"], cut["expanded_local_pos"])
        return apply
    ps.wrap(hp.budget, "apply", make)


def _h_k(ps, hp):
    def make(orig):
        def sample(runner, *a, **k):
            out = orig(runner, *a, **k)
            st = getattr(getattr(runner, "sampler", None), "thinking_budget_state", None)
            if getattr(st, "enabled", False):
                ids = out[0].sampled_token_ids
                end = st.reasoning_end_token_ids[:1].to(ids.dtype)
                ids.masked_fill_(ids == end, 0)
            return out
        return sample
    ps.wrap(hp.runner, "sample", make)


def _forcing_fault(ps, hp, rows_of):
    """After apply (inner to it), +1e9 at ``end[0]`` in the logits rows ``rows_of`` selects
    (``rows_of(state, args) -> bool [rows]`` on the device)."""
    def make(orig):
        def apply(state, *a, **k):
            out = orig(state, *a, **k)
            if getattr(state, "enabled", False):
                import torch

                args = hookpoints.budget_apply_args(hp.generation, a, k)
                with torch.inference_mode():
                    rows = rows_of(state, args).nonzero().flatten()
                    if rows.numel():
                        end = state.reasoning_end_token_ids.long()[:1]
                        args.logits[rows.unsqueeze(1), end.unsqueeze(0)] = 1e9
            return out
        return apply
    ps.wrap(hp.budget, "apply", make)


def _use(state, args):
    """Per logits row: the row's slot is registered with a budget (vLLM's host array)."""
    import torch

    use = torch.as_tensor(state.use_thinking_budget, device=args.logits.device)
    return use[args.expanded_idx_mapping.long()]


def _h_d_early(ps, hp):
    _forcing_fault(ps, hp, lambda st, x: (x.expanded_local_pos > 0) & _use(st, x))


def _h_d_unbudgeted(ps, hp):
    _forcing_fault(ps, hp, lambda st, x: ~_use(st, x))


def _h_d_twice(ps, hp):
    def ended(st, x):
        slot = x.expanded_idx_mapping.long()
        return (st.cached_last_end[slot] > st.cached_last_start[slot]) & _use(st, x)
    _forcing_fault(ps, hp, ended)


_BUILDERS = {"H-a": _h_a, "H-b": _h_b, "H-c": _h_c, "H-d": _h_d, "H-d-draft": _h_d_draft,
             "H-e": _h_e, "H-f": _h_f, "H-g": _h_g, "H-h": _h_h,
             # issue #12: the causes H-d was a catch-all for, and the reporter's state (H-i)
             "H-i": _h_i, "H-i-inband": _h_i_inband, "H-d-cache": _h_d_cache, "H-d-restart": _h_d_restart,
             "H-d-column": _h_d_column, "H-e-copy": _h_e_copy, "H-e-sample": _h_e_sample,
             "H-j": _h_j, "H-k": _h_k,
             # issue #26: the end forced where it is not due
             "H-d-early": _h_d_early, "H-d-unbudgeted": _h_d_unbudgeted,
             "H-d-twice": _h_d_twice}
             

# ==============================================================================================
# Issue #13 — out-of-band writers (H-i). Start-up faults: their patches must be in place before
# the engine starts (in-process: ``workbook.hooks.pre_start``; ``vllm serve``: the plugin, at
# model-runner import). Each binds to the first runner that loads its model after injection.
#
# The writer hides inside one module's forward (the target's first decoder-layer MLP, or the MTP
# drafter's first MLP) and, when active, zeroes the budget state's three marker tensors and its
# two marker caches through a raw alias of their storage: a new tensor ``set_`` onto the same
# storage, then ``fill_`` — storage, data pointer and ``_version`` of the state's tensors stay
# unchanged, exactly what the reporter measured. Active windows: the profiling run only
# (``H-i-profile``, ``H-i-profile-mtp``: a start-up phase the CPU worker of vLLM 0.30+ skips
# unless ``RunConfig.cpu_profile_run``) or real engine step ``STEP_N`` only (``H-i-step``, which
# also zeroes replica 0 of the guard's per-slot state when the guard is installed).

STEP_N = 3


class OutOfBandWriter:
    """State of one injected writer: the runner it lives in, where and when it writes."""

    def __init__(self, name: str, where: str, when: str, hit_guard: bool = False):
        self.name, self.where, self.when, self.hit_guard = name, where, when, hit_guard
        self.runner = None
        self.module = None  # qualified name of the module it hides in
        self.in_profile = 0
        self.step = 0
        self.fired: list[dict] = []

    def arm(self, runner) -> None:
        self.runner = runner
        if self.where == "drafter":
            spec = getattr(runner, "speculator", None)
            root = getattr(spec, "model", None)
            if root is None:
                raise RuntimeError(f"fault {self.name}: no drafter model (it needs MTP "
                                   "speculation: spec_method='mtp')")
            prefix, want = "drafter", lambda n: n.endswith("mlp")
        else:
            root, prefix = runner.model, "target"
            want = lambda n: n.endswith("layers.0.mlp")  # noqa: E731
        name, mod = next(((n, m) for n, m in root.named_modules() if want(n)), (None, None))
        if mod is None:
            raise RuntimeError(f"fault {self.name}: no module to hide in ({prefix})")
        self.module = f"{prefix}.{name}"
        orig = mod.forward
        writer = self

        def forward(*a, **k):
            out = orig(*a, **k)
            if writer.active():
                writer.write()
            return out

        mod.forward = forward

    def active(self) -> bool:
        if self.fired:
            return False
        if self.when == "profile":
            return self.in_profile > 0
        return self.step == STEP_N

    def write(self) -> None:
        st = getattr(getattr(self.runner, "sampler", None), "thinking_budget_state", None)
        hit = []
        if st is not None and getattr(st, "enabled", False):
            for attr in MARKER_ATTRS + CACHE_ATTRS:
                t = getattr(st, attr, None)
                if t is not None:
                    raw_alias_zero(t)
                    hit.append(attr)
        g = self.runner.__dict__.get("_workbook_guard") if self.hit_guard else None
        if g is not None and getattr(g, "replicas", None):
            raw_alias_zero(g.replicas[0])
            hit.append("guard.replicas[0]")
        self.fired.append({"module": self.module, "when": self.when, "step": self.step,
                           "tensors": hit})


WRITERS: list[OutOfBandWriter] = []  # ground truth of the writers injected in this process


def _h_i_writer(name: str, where: str, when: str, hit_guard: bool = False):
    def build(ps, hp):
        from workbook.vllm import startup

        w = OutOfBandWriter(name, where, when, hit_guard)
        WRITERS.append(w)

        def make_load(orig):
            def load_model(runner, *a, **k):
                out = orig(runner, *a, **k)
                if w.runner is None:
                    w.arm(runner)
                return out
            return load_model

        def make_profile(orig):
            def profile_run(runner, *a, **k):
                mine = runner is w.runner
                w.in_profile += mine
                try:
                    return orig(runner, *a, **k)
                finally:
                    w.in_profile -= mine
            return profile_run

        def make_execute(orig):
            def execute_model(runner, *a, **k):
                if runner is w.runner and startup.is_real_step(
                        a[0] if a else k.get("scheduler_output"), k):
                    w.step += 1
                return orig(runner, *a, **k)
            return execute_model

        ps.wrap(hp.runner, "load_model", make_load)
        if when == "profile":
            ps.wrap(hp.runner, "profile_run", make_profile)
        else:
            ps.wrap(hp.runner, "execute_model", make_execute)
    return build


_BUILDERS.update({
    "H-i-profile": _h_i_writer("H-i-profile", "target", "profile"),
    "H-i-profile-mtp": _h_i_writer("H-i-profile-mtp", "drafter", "profile"),
    "H-i-step": _h_i_writer("H-i-step", "target", "step", hit_guard=True),
})
