"""The thinking budget's own part of the tracer (``workbook.hooks.observe.tracer``): what
``ThinkingBudgetState.apply`` and vLLM's two budget kernels read and wrote, and its evidence.

``BudgetTrace`` is a mixin that ``Tracer`` inherits. It provides the wrappers the tracer's patch
set installs around ``ThinkingBudgetState.apply`` (``_w_budget_apply``), ``apply_thinking_budget``
(``_w_kernel_launch``) and the Triton launches of the scan and forcing kernels (``_w_triton`` →
``_LaunchProxy`` → ``_on_launch``: what each launch really received); the reasoning
configuration's marker ids (``_markers``) and the baseline of the state's marker tensors before
the first request (``_snapshot_markers``); the device reads of the per-slot state
(``_read_markers``, ``_read_state``, ``_device_checksum``, ``_bias_delta``); and, when the trace
is read, the request columns judged from them (``_state_evidence``).

Evidence per budgeted request and step, read from the live objects and checked (when the trace
is read) against a host-side truth computed from the committed history and the reasoning
configuration with the one budget rule (``workbook.core.budget``):

- the state's device marker ids (start, end, natural end) as the kernel reads them, their
  storage address and ``_version``, vs the configured ids (``markers_ok``);
- the marker caches (last start, last end, scan position) BEFORE ``apply``, right after the
  scan kernel and after ``apply``, vs the rule's last start and vs vLLM's cache update replayed
  on the host (``budget.scan_marker_cache``): ``cache_before_ok``, ``cache_scan_ok``,
  ``cache_after_ok``;
- the device view of the committed history (``total_len``, a checksum of
  ``all_token_ids[slot, :total_len]``) vs the host history (``history_ok``);
- host vs device budget, ``enabled``, registration, gate, fast path, kernels launched, whether
  the kernels were handed the state's own tensors (``kernel_substituted``), local positions
  (``positions_ok``) and a row→slot mapping that sends each request's rows to its own slot
  (``mapping_ok``; whose slot: the tracer's docstring);
- per row: the rule's truth (``due``, ``due_token``, ``count_host``), the columns whose value
  jumped by >= 1e8 across ``apply`` (``bias_cols``), the due column after ``apply``, in the
  tensor the kernel wrote (when it is not ``apply``'s) and in the tensor the sampler / rejection
  sampler actually consumed (``due_logit_sampled``, its top-1), and whether those tensors are
  the storage ``apply`` biased (``sampled_is_biased``); where the emitted token came from
  (``from_draft``).

The per-slot reads use the requests' own slots (the host's record, ``Tracer._own_index``), never
the batch's mapping.

What it deliberately does NOT do: install or remove anything (``Tracer.taps`` lists its
wrappers among the tracer's taps, which the run's one observer installs), keep steps, calls, rows or the host history, or build
tables: the gate, fast path, mapping and per-row columns are recorded and laid out by the tracer
(``Tracer._before_apply`` / ``_after_apply``, ``Tracer._rows_of``) from what this records in
``call.apply``. Inside a step it only clones small device tensors with device indices (never
synchronizing; its one host read of device values, the marker baseline, comes before the first
request); they are copied to the host with the tracer's pending steps. It never writes into
vLLM tensors, never changes a return value and launches every kernel with the arguments it was
given. It does not import the tracer at run time (the tracer imports it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbook.core import budget
from workbook.hooks.observe.trace_records import TraceCall
from workbook.vllm import hookpoints


FORCED_THRESHOLD = budget.FORCED_LOGIT


MARKER_KEYS = tuple(budget.KEYS)  # start, end, natural_end
MARKER_ATTRS = tuple(budget.KEYS.values())  # ThinkingBudgetState's (= reasoning_config's) names
SCAN_KERNEL = "_update_committed_marker_cache_kernel"  # vLLM's two budget kernels (0.28-0.32)
FORCE_KERNEL = "_thinking_budget_kernel"
MARKER_ARGS = {"reasoning_start_token_ids": "reasoning_start_token_ids_ptr",
               "reasoning_end_token_ids": "reasoning_end_token_ids_ptr",
               "natural_reasoning_end_token_ids": "natural_reasoning_end_token_ids_ptr"}
STATE_ARGS = {"thinking_token_budget_ptr": "budget", "all_token_ids_ptr": "all_token_ids",
              "total_len_ptr": "total_len", "cached_last_start_ptr": "cached_last_start",
              "cached_last_end_ptr": "cached_last_end", "cached_scan_pos_ptr": "cached_scan_pos",
              **{v: k for k, v in MARKER_ARGS.items()}}  # kernel argument -> the state's tensor
CALL_ARGS = {"expanded_idx_mapping_ptr": "expanded_idx_mapping", "input_ids_ptr": "input_ids",
             "expanded_local_pos_ptr": "expanded_local_pos", "req_ids_ptr": "req_ids"}


def _state_tensor(state, key: str):
    if key == "budget":
        return state.thinking_token_budget.gpu
    if key in ("all_token_ids", "total_len"):
        return getattr(state.req_states, key).gpu
    return getattr(state, key)


class _LaunchProxy:
    """Stands in for one of vLLM's Triton budget kernels (a module global, looked up at each
    launch): ``kernel[grid](*args)`` tells the tracer what the launch really received (and,
    when it was not ``apply``'s logits, what it wrote), then launches the original."""

    def __init__(self, fn, name: str, tracer: "BudgetTrace"):
        self._fn, self._name, self._tracer = fn, name, tracer

    def __getitem__(self, grid):
        launch = self._fn[grid]

        def run(*a, **k):
            t = self._tracer
            after = None
            try:
                named = dict(zip(self._fn.arg_names, a))
                named.update(k)
                after = t._on_launch(self._name, named)
            except Exception as e:  # the tracer must never break the engine
                t._error(f"launch:{self._name}", e)
            out = launch(*a, **k)
            if after is not None:
                try:
                    after()
                except Exception as e:
                    t._error(f"launch:{self._name}", e)
            return out

        return run

    def __getattr__(self, name):
        return getattr(self._fn, name)


class BudgetTrace:
    """The thinking budget's part of ``Tracer`` (a mixin: ``Tracer`` inherits it and
    lists its wrappers among its taps). It keeps no state of its own: what it
    reads and writes (``_call``, ``_step``, ``markers``, ``_rule_markers``,
    ``_config_markers``, ``_end_cols``, ``_end_idx``, ``_marker_ptrs``, ``_marker_base``,
    ``_weights``, ``_len_ub``, ``_checksum``) is ``Tracer.__init__``'s, and it calls the
    tracer's ``_end_vals``, ``_own_index`` and ``_error``."""

    # ---- ThinkingBudgetState.apply ----------------------------------------------------------
    def _w_budget_apply(self, orig):
        tracer = self

        def apply(state, *a, **k):
            call = tracer._call
            if call is None or tracer._step is None:
                return orig(state, *a, **k)
            args = hookpoints.budget_apply_args(tracer.hp.generation, a, k)
            slots_np = own_slots(call)  # the requests' own slots (host record)
            rec = call.apply
            call.apply_called = True
            logits = args.logits
            rec.update(state=state, enabled=bool(state.enabled), a_ptr=logits.data_ptr(),
                       launched=False, substituted=[], idx=None)
            rec["before"] = tracer._end_vals(logits)
            full_before = None
            if state.enabled:
                rec["idx"] = tracer._own_index(call, logits.device)
                rec["use"] = np.array(state.use_thinking_budget[slots_np], copy=True)
                rec["budget_host"] = np.array(state.thinking_token_budget.np[slots_np], copy=True)
                full_before = logits.clone()
            try:
                out = orig(state, *a, **k)
            finally:
                rec.pop("state", None)
            rec["after"] = tracer._end_vals(logits)
            if full_before is not None:
                tracer._bias_delta(rec, logits, full_before)
                del full_before
            if state.enabled:
                import torch

                idx = _slots(rec)
                if "markers_dev" not in rec:  # no kernel ran: what the kernels would read
                    tracer._read_markers(rec, [getattr(state, n) for n in MARKER_ATTRS])
                if "cache_before" not in rec:
                    tracer._read_state(rec, idx, state.thinking_token_budget.gpu,
                                       state.req_states.all_token_ids.gpu,
                                       state.req_states.total_len.gpu, state.cached_last_start,
                                       state.cached_last_end, state.cached_scan_pos)
                # [3, reqs] last start / last end / scan position after apply (one gather)
                rec["cache_after"] = torch.stack([state.cached_last_start,
                                                  state.cached_last_end,
                                                  state.cached_scan_pos])[:, idx]
            rec["slots"] = slots_np
            return out

        return apply

    @staticmethod
    def _bias_delta(rec: dict, logits, before) -> None:
        """Per row: the two columns that rose most across ``apply`` and how many rose by
        >= 1e8 (device ops only)."""
        import torch

        d = logits.float() - before.float()
        vals, ids = torch.topk(d, min(2, d.shape[-1]), dim=-1)
        rec["delta"] = (vals, ids, (d >= FORCED_THRESHOLD).sum(-1))

    # -- the kernels' own launches: what they really read and wrote --------------------------
    def _snapshot_markers(self, runner) -> None:
        """Baseline of the state's marker tensors (one host read, before the first request of
        this trace: no step runs): storage, ``_version``, values right."""
        state = getattr(getattr(runner, "sampler", None), "thinking_budget_state", None)
        if state is None or not getattr(state, "enabled", False):
            return
        self._markers(runner)
        ms = [getattr(state, n) for n in MARKER_ATTRS]
        self._marker_ptrs = [m.data_ptr() for m in ms]
        self._marker_base = {"versions": [_version(m) for m in ms],
                             "ok": [[int(x) for x in m.reshape(-1).tolist()] for m in ms]
                             == self._config_markers}

    def _read_markers(self, rec: dict, ms: list) -> None:
        import torch

        rec["markers_meta"] = [(m.data_ptr(), _version(m), int(m.numel())) for m in ms]
        rec["markers_dev"] = torch.cat([m.reshape(-1) for m in ms])  # a new tensor
        if self._marker_ptrs is None and "state_markers" not in rec:
            self._marker_ptrs = [m.data_ptr() for m in ms]

    def _read_state(self, rec: dict, idx, budget_t, all_tok, total_len, last_start, last_end,
                    scan_pos) -> None:
        """Device clones of the per-slot state a kernel reads (no sync)."""
        import torch

        # advanced indexing copies: no extra clone needed (each line one or two launches); no
        # detach either: the sampler runs without autograd (every dispatch costs host time)
        rec["cache_before"] = torch.stack([last_start, last_end, scan_pos])[:, idx]
        rec["budget_dev"] = budget_t[idx]
        total = total_len[idx]
        rec["total_len_dev"] = total
        rec["hist_sum_dev"] = self._device_checksum(all_tok, idx, total)

    def _device_checksum(self, all_tok, idx, total):
        """Σ token·(pos+1) over ``all_token_ids[slot, :total_len]`` per slot, on the device."""
        import torch

        step = self._step
        ub = max((self._len_ub.get(r, 0) for r in step.req_ids), default=0) if step else 0
        width = min(int(all_tok.shape[1]), max(int(ub), 1))
        if self._weights is None or self._weights.shape[0] < width or \
                self._weights.device != all_tok.device:
            self._weights = torch.arange(1, int(all_tok.shape[1]) + 1, dtype=torch.int64,
                                         device=all_tok.device)
        w = self._weights[:width]
        wm = torch.where(w <= total.long().unsqueeze(1), w, 0)  # [reqs, width]
        return (all_tok[idx, :width].long() * wm).sum(-1)

    def _substituted(self, rec: dict, call: TraceCall, named: dict) -> list[str]:
        """Kernel pointer arguments that are not the state's / the batch's tensors."""
        state = rec.get("state")
        out = []
        for arg, key in STATE_ARGS.items():
            if arg in named and state is not None and \
                    tensor_ptr(named[arg]) != tensor_ptr(_state_tensor(state, key)):
                out.append(key)
        for arg, key in CALL_ARGS.items():
            if arg in named and key in call.ptrs and tensor_ptr(named[arg]) != call.ptrs[key]:
                out.append(key)
        if "logits_ptr" in named and named["logits_ptr"].data_ptr() != rec.get("a_ptr"):
            out.append("logits")
        return out

    def _w_triton(self, kernel: str):
        tracer = self

        def make(orig):
            return _LaunchProxy(orig, kernel, tracer)

        return make

    def _on_launch(self, kernel: str, named: dict) -> Any:
        call = self._call
        if call is None or self._step is None:
            return None
        rec = call.apply
        state = rec.get("state")
        subst = self._substituted(rec, call, named)
        rec["substituted"] = sorted(set(rec.get("substituted", [])) | set(subst))
        if kernel == SCAN_KERNEL and "req_ids_ptr" in named and "k_req_ids" not in rec:
            rec["k_req_ids"] = named["req_ids_ptr"].clone()  # the slots the scan indexes
        if kernel == SCAN_KERNEL and "cache_before" not in rec:
            idx = _slots(rec)  # the requests' own slots (the kernel's own req_ids may differ)
            caches = [named["cached_last_start_ptr"], named["cached_last_end_ptr"]]
            self._read_state(rec, idx, named["thinking_token_budget_ptr"],
                             named["all_token_ids_ptr"], named["total_len_ptr"],
                             named["cached_last_start_ptr"], named["cached_last_end_ptr"],
                             named["cached_scan_pos_ptr"])
            if state is not None and "budget" in subst:
                rec["state_budget_dev"] = state.thinking_token_budget.gpu[idx]
            if state is not None and ("total_len" in subst or "all_token_ids" in subst):
                t = state.req_states.total_len.gpu[idx]
                rec["state_total_len"] = t
                rec["state_hist_sum"] = self._device_checksum(
                    state.req_states.all_token_ids.gpu, idx, t)

            def after_scan():  # what the scan itself left (before anything else could write)
                import torch

                rec["cache_scan"] = torch.stack(caches)[:, idx]
            return after_scan
        if kernel != FORCE_KERNEL:
            return None
        rec["launched"] = True
        ms = [named[MARKER_ARGS[n]] for n in MARKER_ATTRS]
        if state is not None and any(n in subst for n in MARKER_ATTRS):
            import torch

            own = [getattr(state, n) for n in MARKER_ATTRS]
            rec["state_markers"] = torch.cat([m.reshape(-1) for m in own])  # a copy
            rec["state_markers_len"] = [int(m.numel()) for m in own]
        self._read_markers(rec, ms)
        # the mapping the forcing kernel really got (values: an in-place change keeps pointers)
        if all(a in named for a in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr",
                                     "input_ids_ptr")):
            rec["k_mapping"] = named["expanded_idx_mapping_ptr"].clone()
            rec["k_local_pos"] = named["expanded_local_pos_ptr"].clone()
            rec["k_input_ids"] = named["input_ids_ptr"].clone()
        logits = named.get("logits_ptr")
        if logits is None or "logits" not in subst:
            return None

        def after_force():  # the tensor the kernel really wrote, when not apply's
            rec["k_end"] = self._end_vals(logits)
        return after_force

    def _w_kernel_launch(self, orig):
        tracer = self

        def apply_thinking_budget(*a, **k):
            call = tracer._call
            if call is not None:
                call.apply["launched"] = True
            return orig(*a, **k)

        return apply_thinking_budget

    # ---- markers ------------------------------------------------------------------------------
    def _markers(self, runner) -> None:
        if self.markers is not None:
            return
        rc = getattr(runner.vllm_config, "reasoning_config", None)
        self._rule_markers = budget.Markers.of(rc)
        self.markers = self._rule_markers.to_dict()
        self._config_markers = [[int(t) for t in (getattr(rc, n, None) or [])]
                                for n in MARKER_ATTRS]
        self._end_cols = list(dict.fromkeys(self._rule_markers.end))[:4] or [0]
        self._end_idx.clear()

    # ---- when the trace is read: the state's evidence vs the host truth ----------------------
    def _state_evidence(self, rec: dict, ap: dict, k: int, req_id: str, hist: list) -> None:
        """The device state the kernel read for this request vs the host truth."""
        M = self._rule_markers
        cb = _host(ap["cache_before"])[:, k]
        ls_b, le_b, sp_b = (int(x) for x in cb)
        ca = _host(ap["cache_after"])[:, k]
        ls_a, le_a, sp_a = (int(x) for x in ca)
        md = [int(x) for x in _host(ap["markers_dev"])]
        meta = ap["markers_meta"]
        lens = [m[2] for m in meta]
        parts = [md[sum(lens[:q]):sum(lens[:q + 1])] for q in range(3)]
        if "state_markers" in ap:  # the kernel got other marker tensors than the state's
            rec["kernel_markers"] = dict(zip(MARKER_KEYS, parts))
            sm, sl = [int(x) for x in _host(ap["state_markers"])], ap["state_markers_len"]
            parts = [sm[sum(sl[:q]):sum(sl[:q + 1])] for q in range(3)]
        truth_start = rec["truth_start"]
        ref = budget.scan_marker_cache(hist, sp_b, ls_b, le_b, M)
        dev_len = int(_host(ap["total_len_dev"])[k])
        dev_sum = int(_host(ap["hist_sum_dev"])[k])
        rec.update(use_thinking_budget=bool(ap["use"][k]),
                   budget_host=int(ap["budget_host"][k]),
                   budget_device=int(_host(ap["budget_dev"])[k]),
                   last_start=ls_a, last_end=le_a, scan_pos=sp_a,
                   last_start_before=ls_b, last_end_before=le_b, scan_pos_before=sp_b,
                   cache_ref_start=budget.cache_start(ref[0], ref[1]),
                   cache_before_ok=budget.cache_start(ref[0], ref[1]) == truth_start,
                   cache_after_ok=budget.cache_start(ls_a, le_a) == truth_start,
                   cache_scan_ok=None if "cache_scan" not in ap else budget.cache_start(
                       *(int(x) for x in _host(ap["cache_scan"])[:2, k])) == truth_start,
                   markers_dev=dict(zip(MARKER_KEYS, parts)),
                   markers_ok=parts == self._config_markers,
                   markers_version=[m[1] for m in meta],
                   markers_version0=(self._marker_base or {}).get("versions"),
                   markers_base_ok=(self._marker_base or {}).get("ok"),
                   markers_moved=self._marker_ptrs is not None
                   and [m[0] for m in meta] != self._marker_ptrs,
                   total_len_dev=dev_len, history_ok=dev_len == len(hist)
                   and dev_sum == self._checksum.get(req_id))
        if "state_budget_dev" in ap:  # the kernel read another budget tensor
            rec["kernel_budget"] = rec["budget_device"]
            rec["budget_device"] = int(_host(ap["state_budget_dev"])[k])
        if "state_total_len" in ap:  # the kernel read another history view
            rec["kernel_history_ok"] = rec["history_ok"]
            rec["kernel_total_len"] = dev_len
            sl_, ss_ = int(_host(ap["state_total_len"])[k]), int(_host(ap["state_hist_sum"])[k])
            rec["total_len_dev"] = sl_
            rec["history_ok"] = sl_ == len(hist) and ss_ == self._checksum.get(req_id)


# ---- helpers (the tracer imports own_slots, tensor_ptr and _host from here: imports point one way) ---

def _slots(rec: dict):
    """The apply call's requests' own slots (``Tracer._own_index``) as an int64 device index:
    the scan launch and ``apply`` both read the per-slot state with it."""
    return rec["idx"]


def own_slots(call: TraceCall) -> np.ndarray:
    """The call's requests' own slots (the host's record); the call's mapping when unknown."""
    return call.owner if call.owner is not None and len(call.owner) == len(call.gate_slots) \
        else call.gate_slots


def _version(t) -> int | None:
    """``t._version`` (None for an inference tensor, which tracks no version)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


def tensor_ptr(t) -> tuple[int, int] | None:
    """(data_ptr, numel) of a tensor: its identity as a kernel argument."""
    return (t.data_ptr(), t.numel()) if hasattr(t, "data_ptr") else None


def _host(t):
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        return t
    return t.detach().cpu().numpy()
