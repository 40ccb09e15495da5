"""The tracer's tables: its pending steps, copied to the host after the step, as table rows.

``TraceTables`` (a mixin ``workbook.hooks.observe.tracer.Tracer`` inherits) turns what the tracer's taps
recorded during a step (device clones, host copies; ``workbook.hooks.observe.trace_records``) into the
``steps`` / ``requests`` / ``rows`` tables (``workbook.core.tracefiles``' columns) and the
``registrations`` and ``meta`` frames, with one synchronization for many steps
(``materialize``); ``save`` / ``flush`` write them. Per row it lays out the evidence columns
(``_rows_of``): the end column before / after ``apply`` and finally, the top-k, the host truth of
the budget rule (``budget.row_truth``: due, due token), the bias columns, the mapping and
positions checks against the host's record of the request's slot.

Deliberately not here: anything done inside a step (the taps: ``workbook.hooks.observe.tracer``, the
budget's reads: ``workbook.hooks.observe.budget_trace``), and judging (``workbook.run.budget.diagnose``). It
keeps no state of its own: the lists and dicts it fills are ``Tracer.__init__``'s.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from workbook.core import budget
from workbook.hooks.observe.budget_trace import FORCED_THRESHOLD


class TraceTables:
    """The tables of ``Tracer`` (a mixin; see the module docstring)."""

    def materialize(self) -> None:
        """Copy pending steps to the host and build their table rows (one sync for all).

        Deferred from the step itself, so tracing costs a step only its small device clones;
        reading ``steps`` / ``requests`` / ``rows`` / ``frames()`` materializes first. The
        ``Outputs`` collector's errors join the steps table as error rows here too.
        """
        self._outputs_errors()
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

    def _materialize(self, step) -> None:
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
        req_calls: dict[int, tuple] = {}
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


REGISTRATION_INTS = ("slot", "prompt_len", "budget_param", "max_tokens", "step", "budget_host")


def _int_columns(df):
    """Integer columns as pandas' nullable ``Int64``: a request without a budget (None) must not
    turn the others' budgets into floats (1 -> 1.0); parquet keeps the type."""
    for c in REGISTRATION_INTS:
        if c in df.columns:
            df[c] = df[c].astype("Int64")
    return df


def _host(t):
    if t is None:
        return None
    return t if isinstance(t, np.ndarray) else t.detach().cpu().numpy()


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
