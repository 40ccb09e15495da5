"""The thinking budget's stage rules: at a violating row, which stage broke its contract, and how.

``classify(c)`` takes the evidence about one violation (``Ctx``: the traced request, the
request-step and logits row that emitted its first violating position, every traced row and
request-step, the markers) and returns the causes of the first stage whose contract is broken
there, each a ``{hypothesis, title, stage, saw, confirm}`` from the catalogue
(``workbook.run.verdicts.cause``); ``[]`` when no stage's contract is seen broken.

The rules. Each stage of MRV2 has a contract (the one stage list, ``workbook.core.stages``, as
the budget reads it: ``workbook.core.hypotheses.STAGES``); the host
truth of every budgeted row is computed by the tracer from the committed history and the
reasoning configuration with the one budget rule (``budget.row_truth``: is the row due, which
end token is due). Stages are checked in pipeline order at the violating row (``RULES``); a
rule fires only when the evidence shows its stage's contract broken there (positive evidence),
and the stages before it held. All rules of the first broken stage are listed.

  ==============  ============  ================================================================
  stage           hypothesis    fires when (at the violating request / step / row)
  ==============  ============  ================================================================
  configuration   H-h           the effective runner is not MRV2 although V2 was asked for
                                (decided by ``workbook.run.budget.diagnose`` before any rule runs)
  state           H-b           ``ThinkingBudgetState.enabled`` is False
  registration    H-c           ``use_thinking_budget`` / host budget != the request's (-1: none)
  batch mapping   H-j           ``idx_mapping`` / ``expanded_idx_mapping`` (host, device, the
                                kernel's) send the request's rows to another slot than the host
                                registered it at (``req_id_to_index``) — checked before any
                                per-slot value; the tracer reads every per-slot value at that
                                registered slot, never through the batch's mapping
  gate            H-a           gate off, fast path taken, or ``apply`` never called
  launch          H-f           ``apply`` ran for a budgeted slot, launched no kernel
  device state    H-i           the state's device marker ids != the configured ids, storage and
                                ``_version`` unchanged (no tracked PyTorch write: out of band)
                  H-i-inband    the same, ``_version`` moved or storage replaced (in band)
                  H-d           device budget != host budget
                  H-d-history   device ``total_len`` / history checksum != the host history
                  H-d-cache     the marker cache entering ``apply`` (replayed over the history)
                                gives another reasoning state than the rule, while the previous
                                ``apply`` had left it right (markers and history right)
  apply           H-d-kernel    right inputs, yet the due row got no winning +1e9 (the bias
                                found at the due column and the winning logit are reported),
                                or the marker scan came out wrong, or ``apply`` handed the
                                kernel other tensors; H-j listed too when forcing tracks the
                                batch composition
                  H-d-column    the due row got +1e9 in another column than the due token
                  H-e           the kernel biased a tensor that is not ``apply``'s
  sampling        H-e           ``apply``'s tensor forced, the tensor sampled not
                  H-e-sample    forced in the tensor sampled, the row's own sample another token
  acceptance      H-g           the position's token is an accepted draft over a forced row,
                                while forced rows sampled on their own did yield the forced token
  commit          H-k           the sampler produced the due token, another was emitted
  ==============  ============  ================================================================

The other side of the contract (``budget.forced_not_due``: ``</think>`` forced where it was not
due — ``early``, ``unbudgeted``, ``twice``; what counts as forced is
``workbook.run.budget.diagnose.forced_indices``'s). Its causes (``FORCING_RULES``): H-c (a budget
registered that was not asked for), H-j (mapping), the device state (H-i…, H-d, H-d-history,
H-d-cache), H-d-kernel (``apply`` biased a row that was not due), H-k (the end committed over
another sampled token). Gate and launch cannot add a forcing and are not consulted.

The row-level tests ``row_forced`` and ``inputs_right`` (and ``FORCED``) live here only; the
trace-wide contract checks (``workbook.run.budget.diagnose.contract_breaks``) import them. The evidence
in sentences (the cache, the mapping, the history view, a marker write) is
``workbook.run.budget.evidence_text``'s; a cause that leaves a question to a probe (batch composition:
the batch-of-one probe) says that probe's result (``workbook.run.verdicts.settled``).

Deliberately not here: judging a request and finding its first violating position and row
(``traced_requests``, ``locate``), building the ``Ctx``, naming one hypothesis from the causes,
the runner check (H-h), the trace-wide contract checks and the probes fed back — all in
``workbook.run.budget.diagnose``, which imports this module (never the other way); the catalogue
(``workbook.core.hypotheses``), the generic verdict helpers (``workbook.run.verdicts``). Like
the diagnosis, no rule reads which fault was injected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbook.core import budget
from workbook.run.budget.evidence_text import (GUARD_KEEPS, bias_found, cache_saw,  # noqa: F401
                                               end_push, fmt, history_saw, in_batch, mapping_saw,
                                               marker_write, reasoning_state)
from workbook.run.verdicts import cause as _cause, dedupe as _dedupe, markers_text, say

FORCED = budget.FORCED_LOGIT


# ---- the evidence a rule reads ------------------------------------------------------------

@dataclass
class Ctx:
    """Everything the rules may read about one violation."""
    req: dict  # traced request (registration, steps, output, budget)
    st: dict  # the request-step that emitted the violating position
    lp: int | None  # its local position
    row: dict | None  # the logits row at that position
    rows_by_pos: dict  # local_pos -> row of that request-step
    rows: list  # every traced row (all requests)
    steps: list  # every traced request-step (all requests)
    markers: budget.Markers
    config_markers: dict  # the configured ids (start, end, natural_end)
    path_of: dict = field(default_factory=dict)  # step -> path

    @property
    def budget(self):
        return self.req["budget"]

    @property
    def kind(self) -> str:
        """Which side of the contract broke (``budget.VIOLATION_KINDS``)."""
        return self.req.get("kind") or "missing"

    @property
    def due_token(self):
        if self.row is not None and self.row.get("due_token") is not None:
            return int(self.row["due_token"])
        return list(self.markers.end)[0] if self.markers.end else None


# ---- rules, stage by stage (each returns the causes it sees; [] = the stage held) ---------

def _rule_state(c: Ctx) -> list[dict]:
    reg, st = c.req["registration"], c.st
    if reg.get("enabled") is False or st.get("enabled") is False:
        where = "registration" if reg.get("enabled") is False else f"step {st['step']}'s apply"
        return [_cause("H-b", f"ThinkingBudgetState.enabled=False at {where}, although the "
                              f"configured marker ids are {markers_text(c.config_markers)}")]
    return []


def _rule_registration(c: Ctx) -> list[dict]:
    reg, st, b = c.req["registration"], c.st, c.budget
    if "budget_runner" in c.req:
        carried = c.req["budget_runner"]
        carried = "no budget" if carried is None else f"thinking_token_budget={carried}"
        return [_cause("H-c", f"the client asked for {_asked(b)}, the runner's request "
                              f"carried {carried}: the budget was lost before MRV2 registered "
                              "it")]
    use = reg.get("use_thinking_budget")
    host = reg.get("budget_host")
    want_use, want_host = b is not None, (-1 if b is None else int(b))  # vLLM's add_request
    use_now, host_now = st.get("use_thinking_budget"), st.get("budget_host")
    wrong = [x for x in (use, use_now) if x is not None and bool(x) != want_use] + \
        [x for x in (host, host_now) if x is not None and int(x) != want_host]
    if wrong:
        asked = f"budget {b}" if b is not None else "no budget"
        return [_cause("H-c", f"MRV2 registered use_thinking_budget={say(use)}, host budget="
                              f"{say(host)} for a request with {asked} (at the violating step "
                              f"they held {say(use_now)} and {say(host_now)})")]
    return []


def _rule_mapping(c: Ctx) -> list[dict]:
    """The batch's row->slot mapping against the host's own record of the request's slot
    (``req_states.req_id_to_index``): checked before any per-slot value is judged, since every
    per-slot value the kernel read went through it."""
    st = c.st
    if st.get("mapping_ok") is not False:
        return []
    return [_cause("H-j", f"at step {st['step']} ({in_batch(st)}) {mapping_saw(st)}")]


def _asked(b) -> str:
    return "no budget" if b is None else f"thinking_token_budget={b}"


def _rule_gate(c: Ctx) -> list[dict]:
    st = c.st
    if st.get("gate") is None and st.get("path") is not None:
        return [_cause("H-a", "apply_sampling_params never ran for this request at step "
                              f"{st['step']} ({st['path']}): logits processing was skipped")]
    if st.get("gate") is False:
        return [_cause("H-a", f"the per-slot gate was False (fast path {say(st.get('fast_path'))})"
                              f" at step {st['step']}: the budgeted slot is not marked for "
                              "logits processing")]
    # the slot's gate is on, yet the decision skipped it: taken for the whole batch
    if st.get("fast_path") is True:
        causes = [_cause("H-a", f"the per-slot gate was True, yet apply_sampling_params took its "
                                f"fast path at step {st['step']} (batch of "
                                f"{say(st.get('batch_size'), 'an unrecorded size')}): the "
                                "logits went unprocessed")]
    elif st.get("apply_called") is False:
        return [_cause("H-a", f"logits processing ran at step {st['step']} but never called "
                              "ThinkingBudgetState.apply for the budgeted slot")]
    else:
        return []
    batch = _batch_dependence(c, "processed")  # the fast path is decided per batch
    if batch:
        causes.append(_cause("H-j", batch, awaits="alone"))
    return causes


def _rule_launch(c: Ctx) -> list[dict]:
    st = c.st
    if st.get("apply_called") and st.get("enabled") and st.get("use_thinking_budget") and \
            st.get("kernels_launched") is False:
        causes = [_cause("H-f", f"ThinkingBudgetState.apply ran at step {st['step']} for a "
                                "budgeted, enabled slot (batch of "
                                f"{say(st.get('batch_size'), 'an unrecorded size')}) but "
                                "launched no kernel")]
        batch = _batch_dependence(c, "launched")
        if batch:
            causes.append(_cause("H-j", batch, awaits="alone"))
        return causes
    return []


def _rule_device_state(c: Ctx) -> list[dict]:
    st, out = c.st, []
    if st.get("markers_ok") is False:
        md = st.get("markers_dev") or {}
        hyp, how = marker_write(st)
        out.append(_cause(hyp, f"at step {st['step']} the state's device marker ids read "
                               f"{markers_text(md)}, where the configured ids are "
                               f"{markers_text(c.config_markers)}; {how}"))
    bd, bh = st.get("budget_device"), st.get("budget_host")
    if bd is not None and bh is not None and int(bd) != int(bh):
        out.append(_cause("H-d", f"the device budget {bd} differs from the host budget {bh} "
                                 f"for slot {say(st.get('slot'))} at step {st['step']}"))
    if st.get("history_ok") is False:
        out.append(_cause("H-d-history", f"at step {st['step']} {history_saw(st)}"))
    if st.get("cache_before_ok") is False and st.get("markers_ok") is not False and \
            st.get("history_ok") is not False and (bd is None or int(bd) >= 0):
        prev = _previous_apply(c)
        left = (f"the marker scan at step {prev['step']} left last_start="
                f"{say(prev.get('last_start'))} last_end={say(prev.get('last_end'))}, where "
                f"{reasoning_state(prev.get('truth_start'))}") if prev is not None else ""
        if prev is not None and prev.get("cache_after_ok") is False and \
                prev.get("markers_ok") is False:
            hyp, how = marker_write(prev)
            out.append(_cause(hyp, f"{left}: it read marker ids "
                                   f"{markers_text(prev.get('markers_dev'))}, where the "
                                   f"configured ids are {markers_text(c.config_markers)}; "
                                   f"{how}"))
        elif prev is not None and prev.get("cache_after_ok") is False and \
                prev.get("history_ok") is False:
            out.append(_cause("H-d-history", f"{left}: {history_saw(prev)}"))
        elif prev is not None and prev.get("cache_after_ok") is False and \
                prev.get("cache_scan_ok") is not True and prev.get("kernels_launched") and \
                inputs_right(prev):
            out.append(_cause("H-d-kernel", left + " from right inputs"))
        elif prev is not None and prev.get("cache_after_ok") is False:
            out.append(_cause("H-d-cache", f"{cache_saw(st)}; the scan at step "
                                           f"{prev['step']} had computed it right, and "
                                           "something changed it after the scan"))
        else:
            out.append(_cause("H-d-cache", cache_saw(st) + (
                "" if prev is None else f"; step {prev['step']}'s apply had left it right")))
    return out


def _previous_apply(c: Ctx) -> dict | None:
    prev = [s for s in c.req["steps"] if s["step"] < c.st["step"]
            and s.get("cache_after_ok") is not None]
    return prev[-1] if prev else None


def inputs_right(s: dict) -> bool:
    return (s.get("markers_ok") is not False and s.get("history_ok") is not False
            and s.get("mapping_ok") is not False and s.get("positions_ok") is not False
            and s.get("cache_before_ok") is not False
            and (s.get("budget_device") is None or s.get("budget_host") is None
                 or int(s["budget_device"]) == int(s["budget_host"])))


def _substituted(c: Ctx) -> list[str]:
    """What apply handed the kernel that is not the state's and holds wrong values."""
    st, bad = c.st, []
    km, kb = st.get("kernel_markers"), st.get("kernel_budget")
    if km and {k: list(v) for k, v in km.items()} != c.config_markers:
        bad.append(f"marker ids {markers_text(km)}")
    if kb is not None and st.get("budget_host") is not None and int(kb) != int(st["budget_host"]):
        bad.append(f"budget {kb} (host {st['budget_host']})")
    if st.get("kernel_history_ok") is False:
        bad.append(f"a history view of total_len {say(st.get('kernel_total_len'))} "
                   f"(committed {say(st.get('total_len_before'))})")
    if st.get("positions_ok") is False:
        bad.append("local positions / drafts that are not the batch's")
    return bad


def _rule_kernel(c: Ctx) -> list[dict]:
    st, row = c.st, c.row
    if row is None:
        return []
    cols = [int(x) for x in (row.get("bias_cols") or [])]
    emitted = row.get("emitted_token")
    if not row.get("due"):
        return []
    if row_forced(row):
        if emitted is not None and int(emitted) in cols and int(emitted) != c.due_token:
            return [_cause("H-d-column", f"row {row['row']} (local_pos {row['local_pos']}) got "
                                         f"+1e9 in columns {say(cols)}, not only in the due "
                                         f"{say(c.due_token)}; token {emitted} won the tie")]
        return []
    # the row was due and apply's tensor is not forced at the due column
    dk = row.get("due_logit_kernel")
    if dk is not None and dk >= FORCED:
        return [_cause("H-e", f"the kernel wrote +1e9 at row {row['row']}, column "
                              f"{say(c.due_token)}, into a tensor that is not the one apply was "
                              "given (nor the one sampled): apply's logits kept "
                              f"{fmt(row.get('due_logit_after_apply'))} there")]
    bad = _substituted(c)
    handed = (f"; apply handed the kernel {' and '.join(bad)}, not the state's tensors"
              if bad else "")
    if cols:
        return [_cause("H-d-column", f"row {row['row']} (local_pos {row['local_pos']}, "
                                     f"count {say(row.get('count_host'))} >= budget "
                                     f"{say(c.budget, 'none')}) got +1e9 in column(s) "
                                     f"{say(cols)}, not in the due {say(c.due_token)} "
                                     f"(left at {fmt(row.get('due_logit_after_apply'))})"
                                     f"{handed}")]
    if bad:
        return [_cause("H-d-kernel", f"at step {st['step']} apply handed the kernel "
                                     f"{' and '.join(bad)} instead of the state's tensors")]
    if st.get("cache_after_ok") is False and st.get("cache_before_ok") is not False and \
            st.get("cache_scan_ok") is True:
        return [_cause("H-d-cache", f"at step {st['step']} the marker scan computed the cache "
                                    "right, yet apply left last_start="
                                    f"{say(st.get('last_start'))} last_end="
                                    f"{say(st.get('last_end'))}, where "
                                    f"{reasoning_state(st.get('truth_start'))}: the cache was "
                                    "changed after the scan")]
    if st.get("cache_after_ok") is False and st.get("cache_before_ok") is not False and \
            inputs_right(st) and st.get("kernels_launched"):
        return [_cause("H-d-kernel", f"from a right cache, the marker scan at step "
                                     f"{st['step']} produced last_start="
                                     f"{say(st.get('last_start'))} last_end="
                                     f"{say(st.get('last_end'))}, where "
                                     f"{reasoning_state(st.get('truth_start'))}")]
    if not inputs_right(st) or st.get("kernels_launched") is not True:
        return []
    where = "a draft row" if row["local_pos"] > 0 else "the first row"
    saw = (f"kernels launched at step {st['step']} with the state's own tensors, markers, "
           f"budget {say(st.get('budget_device'))}, history and caches right, yet {where} "
           f"(row {row['row']}, local_pos {row['local_pos']}, count "
           f"{say(row.get('count_host'))} >= budget {say(c.budget, 'none')}) {bias_found(c)}")
    pat = _pattern(c, "forced")
    if pat and pat["kind"] == "position":
        saw += f"; due rows were forced only when {pat['text']}"
    causes = [_cause("H-d-kernel", saw)]
    # a bias that reached exactly this row's due column shows the kernel processed this row
    # as due (its rows, its slot): batch composition is then excluded
    batch = None if _due_delta(c) > 0 else _batch_dependence(c, "forced")
    if batch:
        causes.append(_cause("H-j", batch, awaits="alone"))
    return causes


def _due_delta(c: Ctx) -> float:
    """What apply added at the violating row's due column (0 when unknown)."""
    row, due = c.row, c.due_token
    before, after = row.get("due_logit_before_apply"), row.get("due_logit_after_apply")
    if before is None and due is not None and c.markers.end and due == c.markers.end[0]:
        before = row.get("end_logit_before_apply")
    return 0.0 if before is None or after is None else float(after) - float(before)


def _rule_forced_kernel(c: Ctx) -> list[dict]:
    """A row that was not due carries the forcing bias (``apply``'s tensor)."""
    st, row = c.st, c.row
    if row is None:
        return []
    cols = [int(x) for x in (row.get("bias_cols") or [])]
    em = row.get("emitted_token")
    earlier = (end_push(row) or ("",))[0] == "earlier"  # forced before the budget's apply
    if em is None or not (int(em) in cols or (row_forced(row) and not earlier and
                                              c.markers.end
                                              and int(em) == int(c.markers.end[0]))):
        return []
    b = c.budget
    why = ("the request has no budget" if b is None else
           f"count {say(row.get('count_host'))} < budget {b}" if c.kind == "early" else
           "its reasoning had already ended")
    bad = _substituted(c)
    handed = (f"; apply handed the kernel {' and '.join(bad)}, not the state's tensors"
              if bad else "; the state's inputs were right")
    put = (f"apply put +1e9 in column(s) {say(cols)}" if cols else
           f"apply raised the end column to {fmt(row.get('end_logit_after_apply'))} "
           f"(from {fmt(row.get('end_logit_before_apply'))})")
    return [_cause("H-d-kernel", f"row {row['row']} (local_pos {row['local_pos']}) at step "
                                 f"{st['step']} was not due ({why}), yet {put}: {em} was forced"
                                 f"{handed}")]


def _rule_forced_push(c: Ctx) -> list[dict]:
    """A row that was not due whose end column a stage raised — an earlier processor by any
    amount (+1e9 included), or the budget's apply short of the forcing bias — and the end was
    emitted there: named from where the rise happened."""
    st, row = c.st, c.row
    if row is None or row.get("bias_cols"):
        return []
    em = row.get("emitted_token")
    push = end_push(row)
    if em is None or push is None or not c.markers.end or int(em) != int(c.markers.end[0]) \
            or (push[0] == "apply" and row_forced(row)):
        return []
    b = c.budget
    why = ("the request has no budget" if b is None else
           f"count {say(row.get('count_host'))} < budget {b}" if c.kind == "early" else
           "its reasoning had already ended")
    where, lo, hi = push
    at = f"row {row['row']} (local_pos {row['local_pos']}) at step {st['step']}"
    if where == "earlier":
        return [_cause("H-p", f"{at} was not due ({why}), yet its end column went "
                              f"{fmt(lo)} -> {fmt(hi)} before the budget's apply (another "
                              f"logits processor raised it; after apply "
                              f"{fmt(row.get('end_logit_after_apply'))}) and {em} was "
                              f"emitted; {GUARD_KEEPS}")]
    return [_cause("H-d-kernel", f"{at} was not due ({why}), yet the budget's apply raised its "
                                 f"end column by +{fmt(hi - lo)} ({fmt(lo)} -> {fmt(hi)}; "
                                 f"not the +1e9 forcing) and {em} was emitted; {GUARD_KEEPS}")]


def _rule_forced_commit(c: Ctx) -> list[dict]:
    """The end token replaced a sampled token after sampling, where it was not due."""
    row = c.row
    if row is None:
        return []
    sv, em = row.get("sampled_vllm"), row.get("emitted_token")
    if sv is not None and em is not None and int(sv) != int(em):
        b = c.budget
        why = "the request has no budget" if b is None else f"budget {b}, {c.kind}"
        return [_cause("H-k", f"the {say(c.st.get('path'), 'sampler')} produced {sv} at row "
                              f"{row['row']}, and {em} was committed instead where no end was "
                              f"due ({why})")]
    return []


def _batch_dependence(c: Ctx, what: str) -> str | None:
    """Why batch composition stays a candidate for a failure seen only as an absence (no
    launch / no +1e9 with right inputs): the violating step batched several requests and no
    success was seen at the same place in a batch of the same size. None when excluded."""
    st = c.st
    size, pos = st.get("batch_size") or 1, st.get("batch_pos") or 0
    if size <= 1:
        return None
    if what == "forced":
        by_key = {(s["req_id"], s["step"]): s for s in c.steps}
        same = [r for r in c.rows if r.get("due") and row_forced(r)
                and (by_key.get((r["req_id"], r["step"])) or {}).get("batch_size") == size
                and (by_key.get((r["req_id"], r["step"])) or {}).get("batch_pos") == pos]
        if same:
            return None
        pat = _pattern(c, "forced")
        why = f"; due rows were forced only when {pat['text']}" if pat and \
            pat["kind"] == "batch" else ""
        return (f"the violating step batched {size} requests (this one at position {pos}) and "
                f"no due row at that place in a batch of {size} was forced{why}")
    if what == "processed":
        ok = [s for s in c.steps if s.get("batch_size") == size and s.get("fast_path") is False
              and s.get("apply_called")]
        if ok:
            return None
        return f"the budgeted slot was skipped in every step with {size} requests"
    same = [s for s in c.steps if s.get("use_thinking_budget") and s.get("kernels_launched")
            and s.get("batch_size") == size]
    if same:
        return None
    return (f"no kernel launched in any step with {size} requests"
            + (", while launches happened in other batches" if any(
                s.get("kernels_launched") for s in c.steps) else ""))


def _rule_sampling(c: Ctx) -> list[dict]:
    row, st = c.row, c.st
    if row is None or not row_forced(row):
        return []
    due = c.due_token
    ds = row.get("due_logit_sampled")
    sampler = "rejection sampler" if st.get("path") == "RejectionSampler" else "sampler"
    if ds is None:  # no consumption traced: the tensor apply_sampling_params returned
        ds = row.get("end_logit_final") if due == (list(c.markers.end) or [None])[0] else None
        where = "the tensor apply_sampling_params returned"
    else:
        where = f"the tensor the {sampler} consumed"
    if ds is not None and ds < FORCED:
        top, top_v = row.get("sampled_top"), row.get("sampled_top_logit")
        if top is not None and top_v is not None and top_v >= FORCED and int(top) != due:
            return [_cause("H-d-column", f"apply forced row {row['row']} at the due column "
                                         f"{due}, but in {where} the +1e9 sits in column {top} "
                                         f"({fmt(top_v)}; {due} holds {fmt(ds)}): it moved "
                                         "between apply and sampling", stage="sampling")]
        ident = row.get("sampled_is_biased")
        if ident is None:
            ident = row.get("returned_is_biased")
        how = ("it was another storage than the one apply biased" if ident is False else
               "it was the same storage: the +1e9 was overwritten after apply" if ident else
               "which storage it was is not recorded")
        return [_cause("H-e", f"apply forced row {row['row']} (column {say(due)} = "
                              f"{fmt(row.get('due_logit_after_apply'))}), but {where} held "
                              f"{fmt(ds)} there — {how}")]
    sv = row.get("sampled_vllm")
    if sv is None or int(sv) == due:
        return []
    if row.get("from_draft") is False:
        return [_cause("H-e-sample", f"row {row['row']} was forced in {where} ({fmt(ds)} at "
                                     f"{say(due)}, its top-1 {say(row.get('sampled_top'))}), "
                                     "yet the "
                                     f"{sampler} sampled {sv} from it (its own sample, not a "
                                     "draft)")]
    if row.get("from_draft"):
        own = [r for r in c.rows if r.get("from_draft") is False and row_forced(r)
               and (r.get("due_logit_sampled") or 0) >= FORCED and r.get("sampled_vllm")
               is not None and c.path_of.get(r["step"]) == st.get("path")]
        ignored = [r for r in own if int(r["sampled_vllm"]) != int(r["due_token"])]
        if ignored:
            r = ignored[0]
            return [_cause("H-e-sample", f"the {sampler} ignores forced rows: step {r['step']} "
                                         f"row {r['row']} (forced, sampled on its own) gave "
                                         f"{r['sampled_vllm']}; so at row {row['row']} its "
                                         f"target pick agreed with the draft {sv}")]
        saw = (f"row {row['row']} was forced in {where}, yet the draft {sv} at local_pos "
               f"{row['local_pos'] + 1} was accepted over it")
        if own:
            return [_cause("H-g", saw + f"; {len(own)} forced rows sampled on their own did "
                                        "yield the forced token")]
        return [_cause("H-g", saw + "; no forced row was sampled on its own to tell"),
                _cause("H-e-sample", "the same accepted draft fits a sampler that ignores "
                                     "forced logits (no forced row sampled on its own to "
                                     "tell them apart)")]
    return []


def _rule_commit(c: Ctx) -> list[dict]:
    row = c.row
    if row is None:
        return []
    sv, em = row.get("sampled_vllm"), row.get("emitted_token")
    if sv is not None and em is not None and int(sv) == c.due_token and int(em) != int(sv):
        return [_cause("H-k", f"the {say(c.st.get('path'), 'sampler')} produced {sv} at row "
                              f"{row['row']}, but {em} was emitted")]
    return []


RULES = (("state", _rule_state), ("registration", _rule_registration),
         ("batch mapping", _rule_mapping), ("gate", _rule_gate), ("launch", _rule_launch),
         ("device state", _rule_device_state), ("apply", _rule_kernel),
         ("sampling", _rule_sampling), ("commit", _rule_commit))
# the other side of the contract: the end forced where it was not due (early, into a request
# without a budget, twice). Gate and launch cannot add a forcing; the stages that can, in order
FORCING_RULES = (("registration", _rule_registration), ("batch mapping", _rule_mapping),
                 ("device state", _rule_device_state), ("apply", _rule_forced_kernel),
                 ("apply", _rule_forced_push), ("commit", _rule_forced_commit))


def row_forced(row: dict) -> bool:
    v = row.get("due_logit_after_apply")
    if v is None:
        v = row.get("end_logit_after_apply")
    return v is not None and v >= FORCED


def _pattern(c: Ctx, what: str) -> dict | None:
    """Does the outcome (``forced`` for due rows with right inputs, or ``kernels_launched``
    for budgeted request-steps) track a feature of the row's place in the batch? Returns the
    feature that separates successes from failures perfectly (both non-empty), preferring the
    row's own position (draft rows) over the batch (composition)."""
    if what == "forced":
        by_key = {(s["req_id"], s["step"]): s for s in c.steps}
        items = []
        for r in c.rows:
            s = by_key.get((r["req_id"], r["step"]))
            if not r.get("due") or s is None or not inputs_right(s) or \
                    s.get("kernels_launched") is not True:
                continue
            items.append((row_forced(r), r["local_pos"] > 0, s.get("batch_pos") or 0,
                          s.get("batch_size") or 1))
    else:
        items = [(bool(s.get("kernels_launched")), False, s.get("batch_pos") or 0,
                  s.get("batch_size") or 1) for s in c.steps
                 if s.get("apply_called") and s.get("use_thinking_budget")]
    ok = [i for i in items if i[0]]
    bad = [i for i in items if not i[0]]
    if not ok or not bad:
        return None
    feats = [("position", "the row is the request's first (local_pos 0), never a draft row",
              lambda i: not i[1]),
             ("batch", "the request is first in its batch", lambda i: i[2] == 0),
             ("batch", "the request is alone in its batch", lambda i: i[3] == 1)]
    for kind, text, f in feats:
        if all(f(i) for i in ok) and not any(f(i) for i in bad):
            return {"kind": kind, "text": f"{text} ({len(ok)} forced, {len(bad)} not)"}
    return None


def classify(c: Ctx) -> list[dict]:
    """The causes of the first stage whose contract is broken at the violating row."""
    for _stage_name, rule in (RULES if c.kind == "missing" else FORCING_RULES):
        causes = rule(c)
        if causes:
            return _dedupe(causes)
    return []
