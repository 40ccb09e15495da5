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

Both directions. Where the budget is not due (host truth: before it binds, in a request without
a budget, or after reasoning ended) and vLLM forced the end anyway, the guard takes it back: a
sampled end id whose column in the logits row the step sampled from holds >= 1e8 while it held
less before ``ThinkingBudgetState.apply`` (the guard wraps ``apply`` to keep, on the device,
those columns' values before the forcing, and the tensor) is replaced by the row's own draw
with the forced columns back at their values — greedy: its argmax; sampled: vLLM's own seeded
Gumbel draw (same seed, position and temperature; ``guard_takeback``) — and the rest of the
step follows as after any replacement (later drafts rejected). The draw runs in the kernel,
only in a row being taken back (no host sync). In a step vLLM's rejection sampler drew
(speculative decoding), the draw is that sampler's own on the rows without the forcing, redone
right after vLLM's call (``guard_redraw``: the guard wraps ``rejection_sample``), and the rest
of the step is that draw's. Where the draw is not reproduced (no request seed; top-k / top-p /
min-p rewrote the row; the rejection sampler's redraw not at hand; a lagged count) the end is
kept and reported "not taken back: <reason>" (``untaken``), never guessed.

Semantics (``vllm/v1/worker/gpu/sample/thinking_budget.py``, restated in
``workbook.core.budget``): for a position whose history (tokens before it) has ``n`` tokens
after the last reasoning start marker, and no natural end marker after that start, the budget
binds when ``n >= budget``; the token there must be ``end_ids[p]`` where ``p`` is the longest
proper prefix of ``end_ids`` the history already ends with. A natural end before the boundary
ends enforcement; multi-token end strings continue.

The host is the truth; the device state is checked against it. vLLM #54906 is a device write
nobody made (``ThinkingBudgetState``'s marker tensors zeroed, storage and ``_version``
unchanged), so nothing the guard decides *whether* and *when* to force with may come from
memory such a writer can reach:

- the marker ids are ``tl.constexpr`` tuples compiled into the kernel, never device tensors;
- the host keeps, per slot, the request's budget (from its ``SamplingParams``), and, for a
  request with a budget, its reasoning count and last ``TAIL`` tokens (``h_budget``,
  ``h_count``, ``h_tail``: numpy, no device memory), advanced from the tokens the guard itself
  emitted (see step 4);
- each guarded step passes that truth *with the launch*: one int32 row per batch row
  (``slot, budget, count, current, tail...``) staged in a pinned buffer and copied
  non-blocking; the slot is the guard's own record of which slot its request was added to
  (``req_id`` → slot at ``add_requests``), never vLLM's device ``idx_mapping``; one more
  column: the slot's request is greedy (its ``SamplingParams.temperature``);
- the device keeps the same per-slot state in three replicas (``GuardState.replicas``, each its
  own allocation), which the kernel checks field by field against the host's row and repairs;
  every repair is logged on the device (request row, slot, field, the three values found, the
  truth) and counted per row in the step's echo.

Processing order, per engine step:

1. ``add_requests`` (after vLLM's): drop finished and preempted requests from the guard's
   ``req_id`` → slot record (MRV2 frees their slots; a resumed request is added anew); for each new request read ``sampling_params.thinking_token_budget`` itself (never
   vLLM's ``ThinkingBudgetState``), its slot ``req_states.req_id_to_index[req_id]`` and
   ``prefill_token_ids``; set the host truth of that slot (budget, and for a budget the count
   and tail at the end of that history, from ``workbook.core.budget``); scatter the staged
   rows into the three replicas with one non-blocking H2D copy.
2. ``sample`` (after vLLM's; inside it ``apply`` left its logits and the end columns before
   the forcing: ``GuardState.capture``, and under speculative decoding the wrapped
   ``rejection_sample`` its draw of the step without the forcing: ``guard_redraw``), host part: absorb every earlier step's echo whose
   copy has landed (``Event.query()``, never a wait) into the host truth (step 4); if no
   request of the batch has a budget (host truth) and apply did not run, return — nothing is
   launched and no request is touched. Else build
   the truth rows of the batch: budget always from the host; count and tail from the host,
   flagged ``current`` when every token this slot committed is on the host — else the kernel
   uses the majority of the replicas for them (only when an earlier step's echo has not landed
   yet: async scheduling; see below).
3. ``_budget_guard_kernel`` (``workbook.hooks.guard.kernel``), one program per batch row: (a)
   check the row's three replicas against the truth — budget, count (the host's ``-1`` for a request without a budget) and,
   for a budgeted request, each tail position; a field where any replica differs is rewritten
   in all three, logged, and counted; (b) a request the host says has no budget returns here,
   its tokens untouched whatever the device held (but an end forced into it, taken back);
   (c) walk the sampled tokens with the truth's budget and count, force the due end token at
   the first binding position or take back a forced end where none is due, truncate
   ``num_sampled`` / add to ``num_rejected``; (d) advance count and tail over the tokens kept
   into the replicas; (e) write the step's echo row: tokens kept, tokens replaced, fields
   repaired, tokens taken back, the kept tokens.
4. host, after the launch: one non-blocking D2H copy of the echo (pinned buffer + event; on a
   CPU the kernel has already run, so it is absorbed at once). Absorbing an echo advances each
   budgeted slot's host count / tail over its kept tokens (numpy for rows without a marker
   token, ``guard_state.advance`` — the kernel's walk on the host — for the others), adds the replaced
   tokens and repaired fields to the host counters, remembers which request each repaired row
   was (for the report), and warns once on vLLM's logger when device state was repaired.

Reporting (off the hot path, one sync): ``GuardState.report()`` → ``{"installed", "enabled",
"guarded_steps", "fixed_tokens" (every token replaced), "taken_back_tokens" (of them, ends
forced where not due), "untaken_steps" (apply ran more than once, or on other rows than the
batch's: no take-back tried), "untaken_rows" / "untaken" (rows that kept such an end: guard
step, row, request, "not taken back: <reason>"), "repaired_fields", "repairs": [record ...],
"repairs_dropped", "truth_lagged_rows", "redraw_errors"}``; ``GuardState.repairs_table()`` → the same records as
a DataFrame with ``REPAIR_COLUMNS`` (the trace's ``guard`` table). A record: ``guard_step``
(the guard's launch counter), ``req_id``, ``slot``, ``row`` (batch row), ``total_len_before``
(committed tokens of the request before that step, joins the tracer's ``requests`` table),
``field`` (``budget`` / ``count`` / ``tail[i]``), ``found`` (the three replicas' values),
``truth`` and ``truth_from`` (``host``, or ``replica majority`` in a lagged step).

What it deliberately does not do: write logits (so logprobs of a replaced token are those of
the token vLLM had sampled), read or repair vLLM's budget state or its committed token history
(the host history it keeps is the guard's own output, copied in stream order right after the
kernel — identical to what vLLM commits unless something rewrites the sampled tokens after the
guard), guard requests that were added while it was not installed, wait for the device on the
hot path (no ``.item()``, no ``synchronize``; the echo is read when its event says it landed),
run Python per token except on rows whose kept tokens contain a marker token, or launch
anything for a batch in which no request has a budget and apply did not run (an unbudgeted
request is then simply not looked at: the guard never changes it, and its replicas are checked the next time it
shares a batch with a budgeted one). Under async scheduling, when a slot's previous echo has
not landed by the next launch, that one step's count and tail come from the replicas'
majority (a corruption of two or three replicas inside that window is repaired and reported
at the slot's next step with a current truth, after that one step's commit); the budget, and so whether a
request is guarded at all, always comes from the host. On healthy vLLM the kernel finds
nothing to fix or repair and outputs are token-identical.

Public API: ``install()`` / ``remove()`` / ``with enabled():``, ``patch_set()`` (the
``PatchSet`` named "guard", layer "guard"), ``state(runner)`` (the ``GuardState`` on a runner,
``runner._workbook_guard``), ``report(runner)`` / ``repairs_table(runner)``. Modules: this
one (the patches, the API), ``guard_state`` (the host truth and ``enforce``),
``guard_takeback`` (the take-back's inputs and modes), ``guard_redraw`` (the rejection
sampler's draw without the forcing), ``guard_kernel`` (the device side).

The guard's room (this package; its hooks and install API are here): ``runstate`` (per-runner
host truth, replicas, enforce, repair reports), ``takeback`` (each row's take-back mode and
inputs), ``redraw`` (vLLM's rejection sampler run again without the forcing), ``kernel`` (the
Triton kernel). May import: core and vllm only.
"""


from __future__ import annotations

import contextlib
import functools
import importlib
import time
from typing import Any

import torch

from workbook.hooks.guard import redraw as guard_redraw
from workbook.hooks.guard import runstate as guard_state
from workbook.hooks.guard.kernel import (  # noqa: F401  (re-exported: tests, benchmarks)
    E_FIXED, E_KEPT, E_REPAIRED, E_TAKEN, E_TOKENS, E_UNTAKEN, F_BUDGET, F_COUNT, F_TAIL, LOG_W,
    M_GREEDY, M_REDRAW, M_REDRAW_ROW, M_SAMPLED, R_DRAFTS,
    R_LAGGED, R_MASKED, R_NO_SEED, R_SAMPLER, T_BUDGET, T_COUNT,
    T_CURRENT, T_SLOT, T_TAIL, TakeBack, new_replica, replica_views, budget_markers, launch,
    launch_guard_kernel)
from workbook.hooks.guard.runstate import (  # noqa: F401  (re-exported)
    ATTR, LOG_N, GuardState, advance, reasoning_count)
from workbook.vllm.patching import PatchSet

_patch_set: PatchSet | None = None
_sampling: "GuardState | None" = None  # the state whose runner's ``sample`` is running


def generation() -> int:
    """The current install's number (bumped by every ``install()``)."""
    return guard_state.INSTALL.generation


def __getattr__(name: str):
    if name == "REPAIR_COLUMNS":
        return guard_state.__getattr__(name)
    raise AttributeError(name)


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
    if st.generation != guard_state.INSTALL.generation:
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
        st.forget(getattr(scheduler_output, "finished_req_ids", None))
        st.forget(getattr(scheduler_output, "preempted_req_ids", None))  # MRV2 removes them too;
        # a resumed request comes back as a new one (its prefill holds its outputs)
        for new_req_data in new_reqs:
            sp = new_req_data.sampling_params
            b = getattr(sp, "thinking_token_budget", None) if sp is not None else None
            slot = self.req_states.req_id_to_index[new_req_data.req_id]
            st.stage(slot, b, new_req_data.prefill_token_ids or [], new_req_data.req_id,
                     sampling_params=sp)
        st.flush()
        return out

    return add_requests


def _w_sample(orig):
    @functools.wraps(orig)
    def sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
        global _sampling
        st = state(self)
        if st is None or not st.enabled:
            return orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
        st.begin_step(input_batch)
        _sampling = st
        try:
            out = orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
        finally:
            _sampling = None
        sampler_output, num_sampled, num_rejected = out
        if st.profile is None:
            st.enforce(sampler_output, num_sampled, num_rejected, input_batch)
        else:
            _profiled_enforce(st, sampler_output, num_sampled, num_rejected, input_batch)
        return out

    return sample


def _w_budget_apply(orig):
    @functools.wraps(orig)
    def apply(self, *args, **kwargs):
        st = _sampling
        if st is not None and getattr(self, "enabled", False):
            logits = args[0] if args else kwargs.get("logits")
            if isinstance(logits, torch.Tensor):
                st.capture(logits)
        return orig(self, *args, **kwargs)

    return apply


def _w_rejection_sample(orig):
    @functools.wraps(orig)
    def rejection_sample(*args, **kwargs):
        out = orig(*args, **kwargs)
        st = _sampling
        if st is not None:  # a guarded step: its draw without the forcing (guard_redraw)
            try:
                st._redraws.append(guard_redraw.redraw(st, orig, args, kwargs))
            except Exception as e:  # noqa: BLE001  (never vLLM's step: the end is kept)
                st._redraws.append(None)
                st.note_redraw_error(e)
        return out

    return rejection_sample


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
        ps.wrap(hookpoints.resolve().budget, "apply", _w_budget_apply)
        rmod = importlib.import_module(hookpoints.resolve().rejection.__module__)
        if hasattr(rmod, "rejection_sample"):  # else no redraw: R_DRAFTS
            ps.wrap(rmod, "rejection_sample", _w_rejection_sample)
        _patch_set = ps
    return _patch_set


def install() -> PatchSet:
    """Install the guard (idempotent). Requests added from now on are guarded."""
    ps = patch_set()
    if not ps.installed:
        guard_state.INSTALL.generation += 1
        ps.install()
    return ps


def remove() -> None:
    """Remove the guard; vLLM's methods are restored identically."""
    if _patch_set is not None:
        _patch_set.remove()


def installed() -> bool:
    return _patch_set is not None and _patch_set.installed


guard_state.INSTALL.installed = installed


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


def report(runner, max_records: int | None = None) -> dict[str, Any]:
    """The guard's verdict section for ``runner`` (one sync); ``{"installed": False, ...}``
    when it never ran there under the current install."""
    st = runner.__dict__.get(ATTR) if runner is not None else None
    if st is None or st.generation != guard_state.INSTALL.generation:
        return {"installed": installed(), "enabled": None, "guarded_steps": 0,
                "fixed_tokens": 0, "taken_back_tokens": 0, "untaken_steps": 0, "untaken_rows": 0,
                "untaken": [], "repaired_fields": 0, "repaired_requests": [],
                "repairs": [], "repairs_dropped": 0, "truth_lagged_rows": 0,
                "redraw_errors": 0}
    return st.report(max_records)


def repairs_table(runner):
    """The trace's ``guard`` table for ``runner``: one row per repair (``REPAIR_COLUMNS``)."""
    import pandas as pd

    st = runner.__dict__.get(ATTR) if runner is not None else None
    if st is None or st.generation != guard_state.INSTALL.generation:
        return pd.DataFrame(columns=__getattr__("REPAIR_COLUMNS"))
    return st.repairs_table()


def describe(runner) -> dict[str, Any]:
    """Small host-side summary for notebooks (syncs: not for the hot path)."""
    st = state(runner)
    if st is None:
        return {"installed": installed(), "state": None}
    rep = st.report(max_records=0)
    return {"installed": installed(), "enabled": st.enabled, "start_ids": st.start_ids,
            "end_ids": st.end_ids, "natural_end_ids": st.natural_end_ids, "tail_len": st.TAIL,
            "slots_with_budget": int(st.has_budget.sum()),
            "total_fixed": rep["fixed_tokens"], "repaired_total": rep["repaired_fields"]}

