"""Per-step tracer of MRV2 sampling internals: what vLLM did with the thinking budget.

``Tracer().install()`` patches (``workbook.vllm.patching`` layer "trace", i.e. outermost) the
hook points of ``workbook.vllm.hookpoints`` (and vLLM's two budget kernels' launches, the
functions that consume the processed logits) and records, for every real engine step (warm-up
and dummy runs never enter ``sample_tokens`` with a request and are ignored):

- **steps**: step index, path (``Sampler`` / ``RejectionSampler``), number of requests, logits
  rows and draft tokens, tokens the guard replaced (if the guard is installed).
- **requests** (one per request per step): request id, slot, phase, drafts verified this step,
  ``enabled``, ``use_thinking_budget[slot]``, the budget in the host array AND in the device
  tensor, the per-slot gate ``needs_logits_processing[slot]``, whether
  ``apply_sampling_params`` took the fast path (returned its input), whether
  ``ThinkingBudgetState.apply`` ran and launched its kernels, the marker caches after it
  (last start / last end / scan position), committed length before and after, the reasoning
  count from the tracer's OWN host-side history (prompt + emitted tokens: independent of vLLM's
  device state), tokens sampled by vLLM, tokens finally emitted, drafts proposed for next step.
- **rows** (one per logits row): local position, input token (the committed last token at 0,
  draft j at j), the end-token logit raw / before ``apply`` / after ``apply`` / after all
  processing, forced (after ``apply`` >= 1e8), top-k ids and values before and after, the token
  vLLM sampled at the row, whether the row's draft was accepted, whether its token was emitted.

This module is the GENERIC recording: the patch set and the wrappers of the step
(``sample_tokens``, ``sample``, the sampling path, ``apply_sampling_params`` per call, what the
sampler / rejection sampler consumed, ``postprocess_sampled``), the host's own history of each
request and its registration (``add_requests``), the pending steps and their deferred host
copies, the index ring, and the tables (``frames()`` / ``save()`` / ``flush()``), including the
per-row evidence columns laid out in ``rows`` (``_rows_of``). What is the thinking budget's own
is NOT here but in ``workbook.hooks.budget_trace`` (``BudgetTrace``, a mixin ``Tracer``
inherits): the ``ThinkingBudgetState.apply`` wrapper, the budget kernels' launches, the marker
ids, the reads of the state's device tensors (markers, caches, device budget, history view) and
the request columns judged from them — that module's docstring lists that evidence. This module
only installs those wrappers (``_build_patches``) and calls them back.

Whose slot? The host's own record: ``req_states.req_id_to_index`` (what ``add_request`` was
given), read at the start of the step. Every per-slot value (gate, registration arrays, and the
budget state's device budget, caches, history read by ``workbook.hooks.budget_trace``) is read
at THAT slot, never through the batch's mapping (``idx_mapping`` / ``expanded_idx_mapping``),
which is itself evidence under suspicion: ``mapping_ok`` compares the batch's mapping (host and
device copies, the kernel's own) with it, and ``batch_slot`` records the slot the batch's
mapping gave.

Processing order inside one step (MRV2): ``sample_tokens`` → ``sample`` → ``Sampler.__call__``
or ``RejectionSampler.__call__`` → ``apply_sampling_params`` (per chunk) →
``ThinkingBudgetState.apply`` → ``apply_thinking_budget`` → [guard] → ``postprocess_sampled``
→ ``speculator.propose``. Device tensors are cloned (small: the end column, top-k, per-slot
values) during the step, never synchronizing (device indices only: no Python list or host
tensor indexes a device tensor inside a step); they are copied to the host, and the table rows
built, only when the trace is read (or every ``max_pending`` steps): one synchronization for
many steps.

It never writes into vLLM tensors and never changes a return value, so what vLLM samples is the
same with or without it; removing it restores the original methods (``workbook.vllm.patching``).
Never whole vocabulary rows: memory is bounded by ``max_steps`` × rows × ``topk``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbook.core import budget
from workbook.hooks.budget_trace import (FORCE_KERNEL, FORCED_THRESHOLD, SCAN_KERNEL,
                                         BudgetTrace, _host, _own, _ptr)
from workbook.vllm import hookpoints, patching


@dataclass
class _Call:
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
class _Step:
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
    sampled_vllm: Any = None  # [reqs, k+1] before the guard
    num_sampled_vllm: Any = None
    sampled: Any = None  # final (emitted)
    num_sampled: Any = None
    num_rejected: Any = None
    total_len_after: Any = None
    proposed: Any = None
    guard_fixed: Any = None


class Tracer(BudgetTrace, patching.Hooked):
    """Install with ``install()`` / ``with Tracer() as t:``; read with ``frames()``."""

    def __init__(self, topk: int = 5, max_steps: int = 20000, flush_dir: str | None = None,
                 flush_every: int = 64, max_pending: int = 256):
        self.topk = topk
        self.max_steps = max_steps
        self.flush_dir = flush_dir
        self.flush_every = flush_every
        self.hp = hookpoints.resolve()
        self.patches = self._build_patches()
        self._step: _Step | None = None
        self._call: _Call | None = None
        self._nsteps = 0
        self._history: dict[str, list[int]] = {}  # req_id -> prompt + emitted (host view)
        self._prompt_len: dict[str, int] = {}
        self.registrations: list[dict] = []
        self._steps: list[dict] = []
        self._requests: list[dict] = []
        self._rows: list[dict] = []
        self._pending: list[_Step] = []  # device-side records not yet copied to the host
        self._index_ring = _IndexRing()
        self.max_pending = max_pending
        self.markers: dict[str, list[int]] | None = None  # the runner's, as a dict (trace meta)
        self._rule_markers = budget.Markers()
        self._config_markers: list[list[int]] = [[], [], []]  # raw reasoning_config lists
        self._end_cols: list[int] = [0]
        self._end_idx: dict = {}  # device -> long tensor of _end_cols (see _end_vals)
        self._budget: dict[str, int | None] = {}  # req_id -> thinking_token_budget asked for
        self._checksum: dict[str, int] = {}  # req_id -> budget.history_checksum(history)
        self._len_ub: dict[str, int] = {}  # req_id -> upper bound of its committed length
        self._slot_of: dict[str, int] = {}  # req_id -> its slot at add_request (host record)
        self._marker_ptrs: list | None = None  # marker storage addresses when first seen
        # the marker tensors before the first request of this trace was added (before anything
        # inside add_requests could write them): versions, and whether they held the ids
        self._marker_base: dict | None = None
        self._weights = None  # device arange(1..max_len) for the history checksum
        self.dropped_steps = 0

    # ---- install / remove ---------------------------------------------------------------
    def remove(self) -> None:
        super().remove()
        if self.flush_dir:
            self.flush()

    def _build_patches(self) -> patching.PatchSet:
        hp = self.hp
        ps = patching.PatchSet("trace", "trace")
        ps.wrap(hp.runner, "add_requests", self._w_add_requests)
        ps.wrap(hp.runner, "sample_tokens", self._w_sample_tokens)
        ps.wrap(hp.runner, "sample", self._w_sample)
        ps.wrap(hp.runner, "postprocess_sampled", self._w_postprocess)
        ps.wrap(hp.sampler, "__call__", self._w_path("Sampler"))
        ps.wrap(hp.rejection, "__call__", self._w_path("RejectionSampler"))
        ps.wrap(hp.sampler, "apply_sampling_params", self._w_apply_sampling_params)
        ps.wrap(hp.budget, "apply", self._w_budget_apply)
        import importlib

        tb_mod = importlib.import_module(hp.budget.__module__)
        if hasattr(tb_mod, "apply_thinking_budget"):
            ps.wrap(tb_mod, "apply_thinking_budget", self._w_kernel_launch)
        for kernel in (SCAN_KERNEL, FORCE_KERNEL):  # the Triton launches themselves
            if hasattr(getattr(tb_mod, kernel, None), "arg_names"):
                ps.wrap(tb_mod, kernel, self._w_triton(kernel))
        # where the processed logits are consumed: the Sampler's sampling functions and the
        # rejection sampler's verification (module-level names, looked up at call time)
        for mod, names in ((importlib.import_module(hp.sampler.__module__),
                            ("gumbel_sample", "flashinfer_sample", "xpu_sample")),
                           (importlib.import_module(hp.rejection.__module__),
                            ("rejection_sample",))):
            for name in names:
                if callable(getattr(mod, name, None)):
                    ps.wrap(mod, name, self._w_consume)
        return ps

    # ---- wrappers -------------------------------------------------------------------------
    def _w_add_requests(self, orig):
        tracer = self

        def add_requests(runner, scheduler_output, *a, **k):
            if tracer._marker_base is None:
                try:
                    tracer._snapshot_markers(runner)
                except Exception as e:
                    tracer._error("markers-baseline", e)
            out = orig(runner, scheduler_output, *a, **k)
            try:
                tracer._on_add_requests(runner, scheduler_output)
            except Exception as e:  # the tracer must never break the engine
                tracer._error("add_requests", e)
            return out

        return add_requests

    def _w_sample_tokens(self, orig):
        tracer = self

        def sample_tokens(runner, *a, **k):
            st = getattr(runner, "execute_model_state", None)
            batch = getattr(st, "input_batch", None) if st is not None else None
            step = tracer._begin_step(batch, runner)
            try:
                return orig(runner, *a, **k)
            finally:
                if step is not None:
                    try:
                        tracer._end_step(runner, step)
                    except Exception as e:
                        tracer._error("sample_tokens", e)
                    tracer._step = None

        return sample_tokens

    def _w_sample(self, orig):
        tracer = self

        def sample(runner, hidden_states, input_batch, *a, **k):
            out = orig(runner, hidden_states, input_batch, *a, **k)
            step = tracer._step
            if step is not None:
                sampler_output, num_sampled, num_rejected = out
                step.sampled = sampler_output.sampled_token_ids.clone()
                step.num_sampled = num_sampled.clone()
                step.num_rejected = num_rejected.clone()
                g = getattr(runner, "_workbook_guard", None)
                fixed = getattr(g, "last_fixed", None)
                step.guard_fixed = fixed.clone() if fixed is not None else None
            return out

        return sample

    def _w_postprocess(self, orig):
        tracer = self

        def postprocess_sampled(runner, idx_mapping, *a, **k):
            out = orig(runner, idx_mapping, *a, **k)
            step = tracer._step
            if step is not None:
                step.total_len_after = runner.req_states.total_len.gpu.clone()
            return out

        return postprocess_sampled

    def _w_path(self, name):
        tracer = self

        def make(orig):
            def __call__(sampler, *a, **k):
                step = tracer._step
                outer = step is not None and step.path is None
                if outer:
                    step.path = name
                out = orig(sampler, *a, **k)
                if outer:
                    step.sampled_vllm = out.sampled_token_ids.clone()
                    step.num_sampled_vllm = out.num_sampled.clone()
                return out

            return __call__

        return make

    def _w_apply_sampling_params(self, orig):
        tracer = self

        def apply_sampling_params(sampler, *a, **k):
            step = tracer._step
            if step is None:
                return orig(sampler, *a, **k)
            args = hookpoints.apply_sampling_args(a, k)
            pos0 = sum(len(c.gate_slots) for c in step.calls)
            n_req = len(args.idx_mapping_np)
            call = _Call(pos0=pos0, owner=step.owner[pos0:pos0 + n_req])
            tracer._call = call
            call.ptrs = {n: _ptr(t) for n, t in (
                ("expanded_idx_mapping", args.expanded_idx_mapping),
                ("req_ids", args.idx_mapping), ("input_ids", args.input_ids),
                ("expanded_local_pos", args.expanded_local_pos))}
            call.slots = args.expanded_idx_mapping.clone()
            call.req_slots = args.idx_mapping.clone()
            call.local_pos = args.expanded_local_pos.clone()
            call.input_ids = args.input_ids.clone()
            call.gate_slots = np.array(args.idx_mapping_np, copy=True)
            # the per-slot gate at each request's own slot (the host's record, not the batch's)
            call.gate = np.array(sampler.needs_logits_processing[_own(call)], copy=True)
            call.end_in = tracer._end_vals(args.logits)
            call.top_in = tracer._topk(args.logits)
            try:
                out = orig(sampler, *a, **k)
            finally:
                tracer._call = None
            call.fast_path = out is args.logits
            call.out_ptr = out.data_ptr()
            call.end_final = tracer._end_vals(out)
            call.top_final = tracer._topk(out)
            step.calls.append(call)
            return out

        return apply_sampling_params

    def _own_index(self, call: _Call, device):
        """The call's requests' own slots as a device index (once per call, no sync, and no
        tensor built from host data: the slots go through a reused index buffer)."""
        if call.apply.get("own_dev") is None:
            call.apply["own_dev"] = self._index_ring.put(_own(call), device)
        return call.apply["own_dev"]

    def _consumed(self, call: _Call, logits) -> None:
        """What the sampler consumed: its storage, the end columns and its top-2 per row."""
        call.s_ptr = logits.data_ptr()
        call.end_s = self._end_vals(logits)
        call.top_s = self._topk(logits, 2)

    def _w_consume(self, orig):
        tracer = self

        def consume(*a, **k):
            step = tracer._step
            if step is not None and step.calls:
                call = step.calls[-1]
                logits = a[0] if a else next((k[n] for n in ("logits", "target_logits",
                                                             "processed_logits") if n in k),
                                             None)
                if call.s_ptr is None and logits is not None and logits.dim() == 2:
                    try:
                        tracer._consumed(call, logits)
                    except Exception as e:
                        tracer._error("consume", e)
            return orig(*a, **k)

        return consume

    # ---- step bookkeeping -------------------------------------------------------------------
    def _on_add_requests(self, runner, scheduler_output) -> None:
        self._markers(runner)
        sampler = getattr(runner, "sampler", None)
        state = getattr(sampler, "thinking_budget_state", None)
        if any(n.req_id in self._history for n in scheduler_output.scheduled_new_reqs):
            self.materialize()  # a re-added request restarts its history: settle the old one
        for new in scheduler_output.scheduled_new_reqs:
            req_id = new.req_id
            slot = runner.req_states.req_id_to_index.get(req_id)
            if slot is not None:
                self._slot_of[req_id] = int(slot)
            tokens = [int(t) for t in (new.prefill_token_ids or [])]
            self._history[req_id] = tokens
            self._checksum[req_id] = budget.history_checksum(tokens)
            self._len_ub[req_id] = len(tokens)
            self._prompt_len[req_id] = int(getattr(new, "prompt_len", len(tokens)) or len(tokens))
            sp = new.sampling_params
            self._budget[req_id] = getattr(sp, "thinking_token_budget", None)
            reg = {"req_id": req_id, "slot": slot, "prompt_len": self._prompt_len[req_id],
                   "prompt_tail": tokens[-8:],
                   "budget_param": getattr(sp, "thinking_token_budget", None),
                   "max_tokens": getattr(sp, "max_tokens", None),
                   "temperature": getattr(sp, "temperature", None),
                   "step": self._nsteps}
            if state is not None and slot is not None:
                reg["enabled"] = bool(state.enabled)
                if state.enabled:
                    reg["use_thinking_budget"] = bool(state.use_thinking_budget[slot])
                    reg["budget_host"] = int(state.thinking_token_budget.np[slot])
            if sampler is not None and slot is not None:
                reg["gate"] = bool(sampler.needs_logits_processing[slot])
            self.registrations.append(reg)

    def _begin_step(self, batch, runner=None) -> _Step | None:
        if batch is None or not getattr(batch, "req_ids", None):
            return None
        req_ids = list(batch.req_ids)
        if not any(r in self._history for r in req_ids):
            return None  # a dummy / warm-up batch
        if self._nsteps >= self.max_steps:
            self.dropped_steps += 1
            return None
        step = _Step(index=self._nsteps, req_ids=req_ids,
                     idx_mapping=np.array(batch.idx_mapping_np, copy=True),
                     idx_mapping_dev=batch.idx_mapping,
                     cu_num_logits=np.array(batch.cu_num_logits_np, copy=True),
                     num_draft_tokens=int(batch.num_draft_tokens))
        now = getattr(getattr(runner, "req_states", None), "req_id_to_index", None) or {}
        # the host's own record of each request's slot: where add_request put its state
        # (req_id_to_index then); the batch's mapping — and req_id_to_index now — are checked
        # against it, never trusted to read per-slot state
        own = [self._slot_of.get(r, now.get(r)) for r in req_ids]
        step.owner = np.array([int(s) if o is None else int(o)
                               for o, s in zip(own, step.idx_mapping)], dtype=np.int64)
        step.index_moved = [r for r, o in zip(req_ids, own)
                            if o is not None and now.get(r) is not None and int(now[r]) != o]
        n_logits = np.diff(step.cu_num_logits)
        for r, n in zip(req_ids, n_logits):  # committed length grows by <= its logits rows
            if r in self._len_ub:
                self._len_ub[r] += int(n)
        self._nsteps += 1
        self._step = step
        return step

    def _end_step(self, runner, step: _Step) -> None:
        spec_states = getattr(runner.req_states, "draft_tokens", None)
        if spec_states is not None and getattr(runner, "speculator", None) is not None:
            step.proposed = spec_states[step.idx_mapping_dev.long()]  # a copy
        self._pending.append(step)
        if len(self._pending) >= self.max_pending:
            self.materialize()
        if self.flush_dir and self._nsteps % self.flush_every == 0:
            self.flush()

    def materialize(self) -> None:
        """Copy pending steps to the host and build their table rows (one sync for all).

        Deferred from the step itself, so tracing costs a step only its small device clones;
        reading ``steps`` / ``requests`` / ``rows`` / ``frames()`` materializes first.
        """
        if not self._pending:
            return
        _sync()
        pending, self._pending = self._pending, []
        for step in pending:
            self._materialize(step)

    @property
    def steps(self) -> list[dict]:
        self.materialize()
        return self._steps

    @property
    def requests(self) -> list[dict]:
        self.materialize()
        return self._requests

    @property
    def rows(self) -> list[dict]:
        self.materialize()
        return self._rows

    def _materialize(self, step: _Step) -> None:
        h = _host
        sampled = h(step.sampled)
        num_sampled = h(step.num_sampled)
        num_rejected = h(step.num_rejected)
        sampled_vllm = h(step.sampled_vllm) if step.sampled_vllm is not None else sampled
        ns_vllm = h(step.num_sampled_vllm) if step.num_sampled_vllm is not None else num_sampled
        total_after = h(step.total_len_after)
        proposed = h(step.proposed)
        fixed = h(step.guard_fixed)
        # batch position -> (call, its index in the call, its first row in the call's logits):
        # the calls cover the batch in order (chunks), whatever slots their mappings name
        req_calls: dict[int, tuple[_Call, int, int]] = {}
        cu = step.cu_num_logits
        for call in step.calls:
            for j in range(len(call.gate_slots)):
                i = call.pos0 + j
                if i < len(step.req_ids):
                    req_calls[i] = (call, j, int(cu[i] - cu[call.pos0]))
        self._steps.append({"step": step.index, "path": step.path, "num_reqs": len(step.req_ids),
                           "num_logits": int(step.cu_num_logits[-1]),
                           "num_draft_tokens": step.num_draft_tokens,
                           "guard_fixed": None if fixed is None else int(np.sum(fixed))})
        for i, req_id in enumerate(step.req_ids):
            slot = int(step.owner[i])  # the host's record (req_id_to_index)
            hist = self._history.setdefault(req_id, [])
            n_logits = int(step.cu_num_logits[i + 1] - step.cu_num_logits[i])
            call, j, off = req_calls.get(i, (None, None, None))
            ap = call.apply if call is not None else {}
            ns = int(num_sampled[i]) if num_sampled is not None else 0
            ns_v = int(ns_vllm[i]) if ns_vllm is not None else ns
            emitted = [int(t) for t in sampled[i, :ns]] if sampled is not None else []
            vllm_tokens = [int(t) for t in sampled_vllm[i, :ns_v]] if sampled_vllm is not None \
                else []
            rec = {"step": step.index, "req_id": req_id, "slot": slot,
                   "batch_slot": int(step.idx_mapping[i]),
                   "phase": "prefill" if len(hist) <= self._prompt_len.get(req_id, 0)
                   else "decode",
                   "path": step.path, "num_logits": n_logits, "num_drafts": n_logits - 1,
                   "batch_pos": i, "batch_size": len(step.req_ids),
                   "total_len_before": len(hist),
                   "reasoning_count": self._reasoning_count(hist),
                   "truth_start": budget.last_start(hist, self._rule_markers),
                   "gate": None if call is None else bool(call.gate[j]),
                   "fast_path": None if call is None else call.fast_path,
                   "apply_called": None if call is None else call.apply_called,
                   "enabled": ap.get("enabled"),
                   "kernels_launched": ap.get("launched"),
                   "kernel_substituted": ap.get("substituted"),
                   "num_sampled_vllm": ns_v, "num_sampled": ns,
                   "num_rejected": int(num_rejected[i]) if num_rejected is not None else None,
                   "sampled_vllm": vllm_tokens, "emitted": emitted,
                   "total_len_after": int(total_after[slot]) if total_after is not None
                   else None,
                   "proposed": [int(t) for t in proposed[i]] if proposed is not None else []}
            if "use" in ap and j is not None and j < len(ap["slots"]):
                try:
                    self._state_evidence(rec, ap, j, req_id, hist)
                except Exception as e:  # evidence missing is no reason to lose the step
                    self._error("state-evidence", e)
            drafts = []
            if call is not None:
                rows = self._rows_of(step, call, slot, req_id, i, sampled, num_sampled,
                                     sampled_vllm, ns_v, off, n_logits, hist, rec, j)
                drafts = [r["input_token"] for r in rows if r["local_pos"] > 0]
                self._rows.extend(rows)
            rec["draft_tokens"] = drafts
            self._requests.append(rec)
            for t in emitted:
                self._checksum[req_id] = self._checksum.get(req_id, 0) + t * (len(hist) + 1)
                hist.append(t)
        return None

    def _rows_of(self, step, call, slot, req_id, i, sampled, num_sampled, sampled_vllm, ns_v,
                 off, n, hist, rec, j):
        h = _host
        slots = h(call.slots)
        local = h(call.local_pos)
        inputs = h(call.input_ids)
        ap = call.apply
        end_in, end_final = h(call.end_in), h(call.end_final)
        before = h(ap.get("before"))
        after = h(ap.get("after"))
        tv_in, ti_in = (h(call.top_in[0]), h(call.top_in[1]))
        tv_out, ti_out = (h(call.top_final[0]), h(call.top_final[1]))
        delta = tuple(h(x) for x in ap["delta"]) if "delta" in ap else None
        k_end = h(ap.get("k_end"))
        end_s = h(call.end_s)
        top_s = (h(call.top_s[0]), h(call.top_s[1])) if call.top_s is not None else None
        ns = int(num_sampled[i]) if num_sampled is not None else 0
        rows = list(range(off, min(off + n, len(slots))))
        # the batch's mapping for these rows, as apply_sampling_params and the kernel got it
        # (host and device copies), against the host's record of the request's slot
        # (mapping_ok); local positions and drafts (positions_ok)
        req_slots = h(call.req_slots)
        mapping_ok = bool(all(int(slots[r]) == slot for r in rows)) \
            and int(call.gate_slots[j]) == slot \
            and (req_slots is None or (j < len(req_slots) and int(req_slots[j]) == slot))
        if req_id in step.index_moved:  # req_id_to_index no longer names its registered slot
            mapping_ok = False
        k_req = h(ap.get("k_req_ids"))
        if k_req is not None:  # the slots the marker-scan kernel itself indexes per request
            mapping_ok = mapping_ok and j < len(k_req) and int(k_req[j]) == slot
        positions_ok = [int(local[r]) for r in rows] == list(range(len(rows)))
        if "k_mapping" in ap:  # the kernel got another mapping than apply_sampling_params
            km, kl, ki = h(ap["k_mapping"]), h(ap["k_local_pos"]), h(ap["k_input_ids"])
            mapping_ok = mapping_ok and len(km) == len(slots) and bool(
                all(int(km[r]) == slot for r in rows))
            positions_ok = positions_ok and len(kl) == len(slots) and len(ki) == len(slots) \
                and [int(kl[r]) for r in rows] == list(range(len(rows))) \
                and all(int(ki[r]) == int(inputs[r]) for r in rows[1:])
        rec["mapping_ok"] = mapping_ok
        # every mapping the call and the kernel got, for the sentence that names the slot
        rec["mapping_slots"] = {
            "rows": [int(r) for r in rows], "expanded": [int(slots[r]) for r in rows],
            "gate": int(call.gate_slots[j]),
            "idx_dev": None if req_slots is None or j >= len(req_slots) else int(req_slots[j]),
            "kernel_req": None if k_req is None or j >= len(k_req) else int(k_req[j]),
            "kernel_rows": [int(km[r]) for r in rows if r < len(km)] if "k_mapping" in ap
            else None, "kernel_n": len(km) if "k_mapping" in ap else None, "n": len(slots),
            "index_moved": req_id in step.index_moved}
        rec["positions_ok"] = positions_ok
        drafts = [int(inputs[r]) for r in rows[1:]]
        b = self._budget.get(req_id)
        a_ptr = ap.get("a_ptr")
        ends = self._end_cols
        out = []
        for lp, r in enumerate(rows):
            truth = budget.row_truth(hist, drafts, lp, b, self._rule_markers,
                                     prompt_len=self._prompt_len.get(req_id, 0))
            e = ends.index(truth.token) if truth.due and truth.token in ends else None
            row = {"step": step.index, "req_id": req_id, "slot": slot, "row": int(r),
                   "local_pos": lp, "input_token": int(inputs[r]),
                   "end_logit_raw": float(end_in[r, 0]),
                   "end_logit_before_apply": None if before is None else float(before[r, 0]),
                   "end_logit_after_apply": None if after is None else float(after[r, 0]),
                   "end_logit_final": float(end_final[r, 0]),
                   "topk_ids_before": [int(x) for x in ti_in[r]],
                   "topk_vals_before": [float(x) for x in tv_in[r]],
                   "topk_ids_after": [int(x) for x in ti_out[r]],
                   "topk_vals_after": [float(x) for x in tv_out[r]],
                   "sampled_vllm": int(sampled_vllm[i, lp]) if sampled_vllm is not None
                   and lp < sampled_vllm.shape[1] and lp < ns_v else None,
                   "emitted_token": int(sampled[i, lp]) if sampled is not None and lp < ns
                   else None,
                   "draft_accepted": (lp >= 1 and lp < ns) if lp >= 1 else None,
                   "emitted": lp < ns,
                   "from_draft": (lp < ns_v - 1) if lp < ns_v else None,
                   "count_host": truth.count, "due": truth.due, "due_token": truth.token,
                   "due_logit_before_apply": None if before is None or e is None
                   else float(before[r, e]),
                   "due_logit_after_apply": None if after is None or e is None
                   else float(after[r, e]),
                   "due_logit_kernel": None if k_end is None or e is None
                   else float(k_end[r, e]),
                   "due_logit_sampled": None if end_s is None or e is None or r >= len(end_s)
                   else float(end_s[r, e]),
                   "sampled_top": None if top_s is None or r >= len(top_s[1])
                   else int(top_s[1][r, 0]),
                   "sampled_top_logit": None if top_s is None or r >= len(top_s[0])
                   else float(top_s[0][r, 0]),
                   "sampled_is_biased": None if call.s_ptr is None or a_ptr is None
                   else call.s_ptr == a_ptr,
                   "returned_is_biased": None if call.out_ptr is None or a_ptr is None
                   else call.out_ptr == a_ptr,
                   "bias_cols": None if delta is None else
                   [int(c) for v, c in zip(delta[0][r], delta[1][r]) if v >= FORCED_THRESHOLD],
                   "n_bias_cols": None if delta is None else int(delta[2][r])}
            row["forced"] = (row["end_logit_after_apply"] is not None
                             and row["end_logit_after_apply"] >= FORCED_THRESHOLD)
            row["forced_final"] = row["end_logit_final"] >= FORCED_THRESHOLD
            out.append(row)
        return out

    # ---- helpers ---------------------------------------------------------------------------
    def _end_vals(self, logits):
        """``logits[:, end columns]`` as a new float tensor [rows, E] (the distinct
        reasoning-end tokens; the first is the ``end_logit_*`` column), gathered with a device
        index made once per device: indexing with a Python list would copy the list to the
        device and synchronize the stream at every call (a stall of the whole step)."""
        import torch

        idx = self._end_idx.get(logits.device)
        if idx is None:
            idx = self._end_idx[logits.device] = torch.tensor(
                self._end_cols, dtype=torch.long, device=logits.device)
        return logits.index_select(-1, idx).float()  # a copy (no grad in the sampler)

    def _topk(self, logits, k: int | None = None):
        import torch

        k = min(k or self.topk, logits.shape[-1])
        vals, ids = torch.topk(logits.float(), k, dim=-1)
        return vals, ids

    def _reasoning_count(self, hist: list[int]) -> int | None:
        return budget.reasoning_count(hist, self._rule_markers)

    def _error(self, where: str, e: Exception) -> None:
        self._steps.append({"step": -1,
                            "path": f"tracer-error:{where}:{type(e).__name__}:{e}"[:300],
                            "num_reqs": 0, "num_logits": 0, "num_draft_tokens": 0,
                            "guard_fixed": None})

    # ---- output ------------------------------------------------------------------------------
    def frames(self) -> dict[str, Any]:
        import pandas as pd

        from workbook.core import tracefiles as store

        return {"steps": store.frame(self.steps, store.STEP_COLUMNS),
                "requests": store.frame(self.requests, store.REQUEST_COLUMNS),
                "rows": store.frame(self.rows, store.ROW_COLUMNS),
                "registrations": _int_columns(pd.DataFrame(self.registrations)),
                "meta": pd.DataFrame([{"markers": self.markers or {},
                                       "hookpoints": self.hp.describe(),
                                       "dropped_steps": self.dropped_steps,
                                       "topk": self.topk, "pid": os.getpid()}])}

    def save(self, path: str) -> list[str]:
        from workbook.core import tracefiles

        return tracefiles.save(self.frames(), path)

    def flush(self) -> None:
        if self.flush_dir:
            self.save(self.flush_dir)


class _IndexRing:
    """Host slot numbers → int64 device index without building a tensor from host data in a
    step: numpy writes into a buffer allocated once (pinned on a GPU), the device copy is queued
    on the stream (``copy_(non_blocking=True)``). ``depth`` buffers in turn; on a GPU a buffer is
    written again only after the event recorded behind its last copy (``depth`` calls later,
    one call per step unless the step is chunked: already passed unless the device is that far
    behind the host)."""

    def __init__(self, depth: int = 4):
        self.depth = depth
        self._i = 0
        self._bufs: dict = {}  # device -> [(host [n], dev [n], event | None)] * depth

    def put(self, slots, device):
        import torch

        n = len(slots)
        ring = self._bufs.get(str(device))
        if ring is None or ring[0][0].numel() < n:
            cap = max(n, 256)
            cuda = device.type == "cuda"
            ring = []
            for _ in range(self.depth):
                host = torch.empty(cap, dtype=torch.int64, pin_memory=cuda)
                ring.append([host, torch.empty(cap, dtype=torch.int64, device=device)
                             if cuda else host, None])
            self._bufs[str(device)] = ring
        self._i = (self._i + 1) % self.depth
        entry = ring[self._i]
        host, dev, ev = entry
        if ev is not None:
            ev.synchronize()  # its previous copy has been read (only waits when far behind)
        host.numpy()[:n] = np.asarray(slots, dtype=np.int64)
        if dev is host:  # CPU: the buffer is the index
            return host[:n]
        out = dev[:n]
        out.copy_(host[:n], non_blocking=True)
        entry[2] = torch.cuda.Event()
        entry[2].record()
        return out


REGISTRATION_INTS = ("slot", "prompt_len", "budget_param", "max_tokens", "step", "budget_host")


def _int_columns(df):
    """Integer columns as pandas' nullable ``Int64``: a request without a budget (None) must not
    turn the others' budgets into floats (1 -> 1.0); parquet keeps the type."""
    for c in REGISTRATION_INTS:
        if c in df.columns:
            df[c] = df[c].astype("Int64")
    return df


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()

