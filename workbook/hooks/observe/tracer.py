"""Per-step tracer of MRV2 sampling internals: what vLLM did with the thinking budget.

``Tracer`` is a collector (``workbook.hooks.observe.observer``: the run's one observer calls its taps
on the hook points of ``workbook.vllm.hookpoints``, layer "trace", i.e. outermost; alone,
``Tracer().install()`` gets an observer of its own) (and vLLM's two budget kernels' launches, the
functions that consume the processed logits) and records, for every real engine step (warm-up
and dummy runs never enter ``sample_tokens`` with a request and are ignored):

- **steps**: step index, path (``Sampler`` / ``RejectionSampler``), number of requests, logits
  rows and draft tokens, tokens the guard replaced (if the guard is installed). What went wrong
  in a tap, the tracer's own or the ``Outputs`` collector's it reads: a row of step -1 whose
  path is ``tracer-error:<where>:…`` (``tracer-error:outputs:…``), in the written trace too.
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

The step's outputs (tokens sampled by vLLM, tokens emitted, rejected drafts, the guard's
replaced rows) are not cloned here: the observer's ``Outputs`` collector
(``workbook.hooks.observe.outputs``, ``want("steps")``) records them once, for the row check too, and
the tracer's ``TraceStep.out`` points at that record.

This module is the GENERIC recording: the taps of the step
(``sample_tokens``, ``sample``, the sampling path, ``apply_sampling_params`` per call, what the
sampler / rejection sampler consumed, ``postprocess_sampled``), the host's own history of each
request and its registration (``add_requests``), the pending steps and the index ring. The
tables built from them after the step (``materialize``, ``frames()`` / ``save()`` /
``flush()``, the per-row evidence columns of ``rows``) are ``workbook.hooks.observe.trace_tables``'
(``TraceTables``, a mixin ``Tracer`` inherits). What is the thinking budget's own
is NOT here but in ``workbook.hooks.observe.budget_trace`` (``BudgetTrace``, a mixin ``Tracer``
inherits): the ``ThinkingBudgetState.apply`` wrapper, the budget kernels' launches, the marker
ids, the reads of the state's device tensors (markers, caches, device budget, history view) and
the request columns judged from them — that module's docstring lists that evidence. This module
only lists those wrappers among its taps (``taps``) and calls them back.

Whose slot? The host's own record: ``req_states.req_id_to_index`` (what ``add_request`` was
given), read at the start of the step. Every per-slot value (gate, registration arrays, and the
budget state's device budget, caches, history read by ``workbook.hooks.observe.budget_trace``) is read
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

import numpy as np

from workbook.core import budget
from workbook.hooks.observe.budget_trace import FORCE_KERNEL, SCAN_KERNEL, BudgetTrace, own_slots, tensor_ptr
from workbook.hooks.observe.observer import Collector, Tap
from workbook.hooks.observe.outputs import Outputs
from workbook.hooks.observe.trace_records import TraceCall, TraceStep
from workbook.hooks.observe.trace_tables import TraceTables
from workbook.vllm import hookpoints


class Tracer(BudgetTrace, TraceTables, Collector):
    """Install with ``install()`` / ``with Tracer() as t:``; read with ``frames()``."""

    def __init__(self, topk: int = 5, max_steps: int = 20000, flush_dir: str | None = None,
                 flush_every: int = 64, max_pending: int = 256):
        self.topk = topk
        self.max_steps = max_steps
        self.flush_dir = flush_dir
        self.flush_every = flush_every
        self.hp = hookpoints.resolve()
        self._step: TraceStep | None = None
        self._call: TraceCall | None = None
        self._nsteps = 0
        self._history: dict[str, list[int]] = {}  # req_id -> prompt + emitted (host view)
        self._prompt_len: dict[str, int] = {}
        self.registrations: list[dict] = []
        self._steps: list[dict] = []
        self._requests: list[dict] = []
        self._rows: list[dict] = []
        self._pending: list[TraceStep] = []  # device-side records not yet copied to the host
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
        self._outputs_seen = 0  # the Outputs collector's errors already among the error rows

    # ---- the observer's taps (``workbook.hooks.observe.observer``) --------------------------------
    name = "trace"
    needs = (Outputs,)
    outputs: Outputs | None = None

    def attached(self, observer) -> None:
        self.outputs = observer.collector(Outputs)
        self.outputs.want("steps")

    def removed(self) -> None:
        if self.flush_dir:
            self.flush()

    def error(self, where: str, e: Exception) -> None:
        self._error(where, e)

    def taps(self) -> list[Tap]:
        hp = self.hp
        out = [Tap(hp.runner, "add_requests", before=self._before_add, after=self._after_add),
               Tap(hp.runner, "sample_tokens", before=self._before_step, final=self._final_step),
               Tap(hp.runner, "postprocess_sampled", after=self._after_postprocess),
               Tap(hp.sampler, "__call__", before=self._path_before("Sampler")),
               Tap(hp.rejection, "__call__", before=self._path_before("RejectionSampler")),
               Tap(hp.sampler, "apply_sampling_params", before=self._before_apply,
                   final=self._final_apply, after=self._after_apply),
               Tap(hp.budget, "apply", make=self._w_budget_apply)]
        import importlib

        tb_mod = importlib.import_module(hp.budget.__module__)
        if hasattr(tb_mod, "apply_thinking_budget"):
            out.append(Tap(tb_mod, "apply_thinking_budget", make=self._w_kernel_launch))
        for kernel in (SCAN_KERNEL, FORCE_KERNEL):  # the Triton launches themselves
            if hasattr(getattr(tb_mod, kernel, None), "arg_names"):
                out.append(Tap(tb_mod, kernel, make=self._w_triton(kernel)))
        # where the processed logits are consumed: the Sampler's sampling functions and the
        # rejection sampler's verification (module-level names, looked up at call time)
        for mod, names in ((importlib.import_module(hp.sampler.__module__),
                            ("gumbel_sample", "flashinfer_sample", "xpu_sample")),
                           (importlib.import_module(hp.rejection.__module__),
                            ("rejection_sample",))):
            for name in names:
                if callable(getattr(mod, name, None)):
                    out.append(Tap(mod, name, before=self._before_consume))
        return out

    # ---- taps ---------------------------------------------------------------------------
    def _before_add(self, runner, scheduler_output, *a, **k):
        if self._marker_base is None:
            try:
                self._snapshot_markers(runner)
            except Exception as e:
                self._error("markers-baseline", e)

    def _after_add(self, _state, _out, runner, scheduler_output, *a, **k):
        self._on_add_requests(runner, scheduler_output)

    def _before_step(self, runner, *a, **k):
        st = getattr(runner, "execute_model_state", None)
        batch = getattr(st, "input_batch", None) if st is not None else None
        return runner, self._begin_step(batch, runner)

    def _final_step(self, state):
        if state is None:
            return
        runner, step = state
        try:
            if step is not None:
                self._end_step(runner, step)
        finally:
            self._step = None

    def _after_postprocess(self, _state, _out, runner, *a, **k):
        step = self._step
        if step is not None:
            step.total_len_after = runner.req_states.total_len.gpu.clone()

    def _path_before(self, name):
        def before(*a, **k):
            step = self._step
            if step is not None and step.path is None:
                step.path = name
                return step
            return None

        return before

    def _before_apply(self, sampler, *a, **k):
        step = self._step
        if step is None:
            return None
        args = hookpoints.apply_sampling_args(a, k)
        pos0 = sum(len(c.gate_slots) for c in step.calls)
        n_req = len(args.idx_mapping_np)
        call = TraceCall(pos0=pos0, owner=step.owner[pos0:pos0 + n_req])
        self._call = call
        call.ptrs = {n: tensor_ptr(t) for n, t in (
            ("expanded_idx_mapping", args.expanded_idx_mapping),
            ("req_ids", args.idx_mapping), ("input_ids", args.input_ids),
            ("expanded_local_pos", args.expanded_local_pos))}
        call.slots = args.expanded_idx_mapping.clone()
        call.req_slots = args.idx_mapping.clone()
        call.local_pos = args.expanded_local_pos.clone()
        call.input_ids = args.input_ids.clone()
        call.gate_slots = np.array(args.idx_mapping_np, copy=True)
        # the per-slot gate at each request's own slot (the host's record, not the batch's)
        call.gate = np.array(sampler.needs_logits_processing[own_slots(call)], copy=True)
        call.end_in = self._end_vals(args.logits)
        call.top_in = self._topk(args.logits)
        return step, call, args.logits

    def _final_apply(self, state):
        self._call = None

    def _after_apply(self, state, out, *a, **k):
        if state is None:
            return
        step, call, logits = state
        call.fast_path = out is logits
        call.out_ptr = out.data_ptr()
        call.end_final = self._end_vals(out)
        call.top_final = self._topk(out)
        step.calls.append(call)

    def _own_index(self, call: TraceCall, device):
        """The call's requests' own slots as a device index (once per call, no sync, and no
        tensor built from host data: the slots go through a reused index buffer)."""
        if call.apply.get("own_dev") is None:
            call.apply["own_dev"] = self._index_ring.put(own_slots(call), device)
        return call.apply["own_dev"]

    def _consumed(self, call: TraceCall, logits) -> None:
        """What the sampler consumed: its storage, the end columns and its top-2 per row."""
        call.s_ptr = logits.data_ptr()
        call.end_s = self._end_vals(logits)
        call.top_s = self._topk(logits, 2)

    def _before_consume(self, *a, **k):
        step = self._step
        if step is not None and step.calls:
            call = step.calls[-1]
            logits = a[0] if a else next((k[n] for n in ("logits", "target_logits",
                                                         "processed_logits") if n in k), None)
            if call.s_ptr is None and logits is not None and logits.dim() == 2:
                self._consumed(call, logits)

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

    def _begin_step(self, batch, runner=None) -> TraceStep | None:
        if batch is None or not getattr(batch, "req_ids", None):
            return None
        req_ids = list(batch.req_ids)
        if not any(r in self._history for r in req_ids):
            return None  # a dummy / warm-up batch
        if self._nsteps >= self.max_steps:
            self.dropped_steps += 1
            return None
        step = TraceStep(index=self._nsteps, req_ids=req_ids,
                     idx_mapping=np.array(batch.idx_mapping_np, copy=True),
                     idx_mapping_dev=batch.idx_mapping,
                     cu_num_logits=np.array(batch.cu_num_logits_np, copy=True),
                     num_draft_tokens=int(batch.num_draft_tokens),
                     out=self.outputs.current)
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

    def _end_step(self, runner, step: TraceStep) -> None:
        spec_states = getattr(runner.req_states, "draft_tokens", None)
        if spec_states is not None and getattr(runner, "speculator", None) is not None:
            step.proposed = spec_states[step.idx_mapping_dev.long()]  # a copy
        self._pending.append(step)
        if len(self._pending) >= self.max_pending:
            self.materialize()
        if self.flush_dir and self._nsteps % self.flush_every == 0:
            self.flush()

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
        self._error_row(f"tracer-error:{where}:{type(e).__name__}:{e}")

    def _error_row(self, path: str) -> None:
        self._steps.append({"step": -1, "path": path[:300], "num_reqs": 0, "num_logits": 0,
                            "num_draft_tokens": 0, "guard_fixed": None})

    def _outputs_errors(self) -> None:
        """The ``Outputs`` collector's errors (the step outputs this trace reads: a tap of it
        that failed leaves the trace's emitted / sampled columns empty) as this trace's own
        error rows, each once: ``tracer-error:outputs:<where>: <error>``."""
        lost = self.outputs.errors if self.outputs is not None else []
        for e in lost[self._outputs_seen:]:
            self._error_row(f"tracer-error:outputs:{e}")
        self._outputs_seen = len(lost)

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
