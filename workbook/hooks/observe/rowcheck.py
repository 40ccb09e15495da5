"""The row check's evidence: per logits row (draft rows included), the raw and processed values
of ``Sampler.apply_sampling_params`` at a bounded set of columns, gathered on the device.

``RowCheck`` is a collector (``workbook.hooks.observe.observer``): its taps sit on MRV2's hook points
(``workbook.vllm.hookpoints``) beside the tracer's, in the run's one observer
(``RowCheck().install()`` alone: an observer of its own):

- ``GPUModelRunner.add_requests``: the request's ``contracts.Params``, prompt, slot, and what
  vLLM's per-slot sampling state holds right after registration (gate, allowed / bias / stop
  counts, ``min_lens``, penalties, bad words: whichever arrays the version has);
- ``GPUModelRunner.sample_tokens``: the step (request ids, slots, rows per request);
- ``Sampler.apply_sampling_params``: per row, raw and processed values at the columns
  ``[static | history | drafts | step | top-K raw | top-K processed]`` — the request's contract
  columns, its committed history as the device holds it, its own drafts, every token of the step
  (all requests' inputs: their drafts), and the ``TOP_K`` largest columns of the raw and of the
  processed row; the number of finite columns (when a request has allowed ids or a schema); the
  penalty counts there (when a request is penalised); whether the fast path returned the input;
- the step's outputs are NOT recorded here but read from the observer's ``Outputs`` collector
  (``workbook.hooks.observe.outputs``, ``want("rows")``): the tokens sampled per request and row, the
  values at the emitted token, and the logprobs vLLM returns per row with what the row says at
  those ids — recorded once, shared with the tracer;
- ``PromptLogprobsWorker.compute_prompt_logprobs``: per prompt position the ids and values vLLM
  returned and, through the same ``logits_fn``, what the row that predicts it says.

Every index is a device tensor: inside a step the check only queues device work (no host
synchronization); ``materialize`` copies after the run. Memory: rows x (static + W + k +
min(rows, ``max_step_tokens``) + 2 ``TOP_K``) columns per step. It never writes into vLLM
tensors nor changes a return value; removing it restores the methods exactly.

Not here: judging (``workbook.run.constraints.rowjudge``: predictions, first violation, stages, attribution
across requests), the contracts (``workbook.core.contracts``).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbook.core import budget, contracts
from workbook.hooks.observe.observer import Collector, Tap
from workbook.hooks.observe.outputs import Outputs, StepOutput, to_host
from workbook.vllm import hookpoints

TOP_K = 4  # the largest columns of the raw and of the processed row kept per row
REG_ATTRS = ("num_allowed_token_ids", "num_logit_bias", "min_lens", "num_stop_token_ids",
             "repetition_penalty", "frequency_penalty", "presence_penalty", "num_bad_words")
# every slot's occupants as the row checks of this process saw them, per runner (an engine's
# lifetime, across batches): the request a slot served before, its constraint parameters
_LEDGER: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def slot_ledger(runner) -> dict[int, list[dict]]:
    """Slot -> the requests registered in it on ``runner`` while a row check watched, oldest
    first (``req_id``, ``constraints``, ``params``: ``contracts.Params`` as a dict)."""
    try:
        return _LEDGER.setdefault(runner, {})
    except TypeError:  # not weak-referenceable
        return {}


def unasked(p: contracts.Params, got: dict, prompt_len: int) -> list[dict]:
    """The other way of the registration check: per-slot state vLLM holds for the request
    right after ``add_request`` that the request did not ask for (a slot's allowed ids, bias,
    bad words, min_tokens' stop mask, penalties or thinking budget left by an earlier
    occupant): ``[{setting, field, found, asked}]``. Only arrays the installed version has."""
    out = []

    def add(setting, field, asked):
        out.append({"setting": setting, "field": field, "found": got[field], "asked": asked})

    known = lambda a: got.get(a) is not None
    if p.allowed_token_ids is None and known("num_allowed_token_ids") and \
            got["num_allowed_token_ids"] != 0:
        add("allowed_token_ids", "num_allowed_token_ids", 0)
    if not p.logit_bias and known("num_logit_bias") and got["num_logit_bias"] != 0:
        add("logit_bias", "num_logit_bias", 0)
    if not p.bad_words and known("num_bad_words") and got["num_bad_words"] != 0:
        add("bad_words", "num_bad_words", 0)
    if p.min_tokens == 0 and known("num_stop_token_ids") and got["num_stop_token_ids"] != 0 \
            and (not known("min_lens") or got["min_lens"] > prompt_len):
        add("min_tokens", "num_stop_token_ids", 0)
    for a in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        if known(a) and abs(float(got[a]) - float(getattr(p, a))) > 1e-6 and not p.penalised:
            add("penalties", a, getattr(p, a))
    if p.thinking_token_budget is None and known("thinking_token_budget") and \
            got["thinking_token_budget"] >= 0:
        add("thinking_token_budget", "thinking_token_budget", -1)
    return out


@dataclass
class _Call:
    offset: int  # first logits row of this call within the step
    n: int  # rows
    slots: Any  # [n] device int
    local_pos: Any  # [n]
    input_ids: Any  # [n]
    cols: Any  # [n, C] device long: static | history | drafts | step | top raw | top proc
    raw: Any  # [n, C]
    proc: Any  # [n, C]
    top2: Any  # (vals [n, K], ids [n, K]) of the processed row
    finite: Any = None  # [n] finite processed columns
    counts: Any = None  # [n, C] vLLM's penalty counts at the columns
    gate: Any = None  # np [reqs] needs_logits_processing of the call's slots
    gate_slots: Any = None
    fast_path: bool = False
    w_static: int = 0
    w_hist: int = 0


@dataclass
class _Step:
    index: int
    req_ids: list
    slots: np.ndarray
    cu: np.ndarray  # host cu_num_logits
    cu_dev: Any
    calls: list = field(default_factory=list)
    out: StepOutput | None = None  # the step's outputs (the observer's ``Outputs``)


class RowCheck(Collector):
    """Install with ``install()`` / ``with RowCheck() as rc:``; judged by
    ``workbook.run.constraints.rowjudge.judge(rc)``."""

    def __init__(self, max_steps: int = 4096, max_drafts: int = 8, max_static: int = 64,
                 max_step_tokens: int = 256, top_k: int = TOP_K):
        self.hp = hookpoints.resolve()
        self.max_steps, self.max_drafts, self.max_static = max_steps, max_drafts, max_static
        self.max_step_tokens, self.top_k = max_step_tokens, top_k
        self.params: dict[str, contracts.Params] = {}
        self.prompts: dict[str, list[int]] = {}
        self.slot_of: dict[str, int] = {}
        self.registrations: list[dict] = []
        self.markers = budget.Markers()
        self.logprobs_mode = "raw_logprobs"
        self._table = None  # device [slots, S] static columns
        self._host_table = None
        self._dev = None
        self._step: _Step | None = None
        self._pending: list[_Step] = []
        self._steps: list[dict] = []  # materialized: one per step and request
        self._nsteps = 0
        self._len_ub: dict[str, int] = {}
        self._history: dict[str, list[int]] = {}  # prompt + emitted (device-sampled) tokens
        self._prompt_pending: list[dict] = []  # prompt-logprob chunks, device tensors
        self._prompt_rows: dict[str, dict[int, dict]] = {}  # req -> prompt position -> row
        self.errors: list[str] = []
        self._outputs_errors = 0  # the outputs collector's errors already copied to errors

    # ---- install ------------------------------------------------------------------------------
    name = "rowcheck"

    needs = (Outputs,)
    outputs: Outputs | None = None

    def attached(self, observer) -> None:
        self.outputs = observer.collector(Outputs)
        self.outputs.want("rows")

    def taps(self) -> list[Tap]:
        hp = self.hp
        out = [Tap(hp.runner, "add_requests", after=self._after_add),
               Tap(hp.runner, "sample_tokens", before=self._before_step, final=self._final_step),
               Tap(hp.sampler, "apply_sampling_params", before=self._before_apply,
                   after=self._after_apply)]
        if hp.prompt_logprobs is not None:  # optional: else no prompt-logprob rows
            out.append(Tap(hp.prompt_logprobs, "compute_prompt_logprobs",
                           after=self._after_prompt_logprobs))
        return out

    def error(self, where: str, e: Exception) -> None:
        self._error(where, e)

    def _error(self, where: str, e: Exception) -> None:
        self.errors.append(f"{where}: {type(e).__name__}: {e}"[:300])

    # ---- registration ---------------------------------------------------------------------------
    def _after_add(self, _state, _out, runner, scheduler_output, *a, **k):
        self._on_add(runner, scheduler_output)

    def _on_add(self, runner, so) -> None:
        import torch

        sampler = getattr(runner, "sampler", None)
        if self._dev is None:
            rc = getattr(runner.vllm_config, "reasoning_config", None)
            self.markers = budget.Markers.of(rc)
            self.logprobs_mode = str(getattr(sampler, "logprobs_mode", None) or getattr(
                runner.model_config, "logprobs_mode", "raw_logprobs"))
            self._dev = runner.req_states.all_token_ids.gpu.device
            n_slots = int(runner.req_states.all_token_ids.gpu.shape[0])
            self._host_table = np.zeros((n_slots, 1), dtype=np.int64)
        changed = False
        for new in so.scheduled_new_reqs:
            if new.req_id in self._history:
                self.materialize()
            sp = new.sampling_params
            p = contracts.Params.of(sp, self.logprobs_mode)
            slot = int(runner.req_states.req_id_to_index[new.req_id])
            tokens = [int(t) for t in (new.prefill_token_ids or [])]
            # the prompt's length: vLLM's ``prompt_len`` (0.29+); 0.28 has none, and its
            # prefill of a request resumed after preemption is prompt + output so far, so the
            # prompt is ``prompt_token_ids`` (a resumed request keeps its first prompt)
            plen = getattr(new, "prompt_len", None)
            if plen is None:
                plen = len(getattr(new, "prompt_token_ids", None) or tokens)
            if new.req_id in self.prompts:
                plen = len(self.prompts[new.req_id])
            plen = int(plen) or len(tokens)
            self.params[new.req_id], self.slot_of[new.req_id] = p, slot
            self.prompts[new.req_id] = tokens[:plen]
            self._history[new.req_id] = list(tokens)
            self._len_ub[new.req_id] = len(tokens)
            cols = p.columns(self.markers)[:self.max_static]
            width = max(self._host_table.shape[1], len(cols), 1)
            if width > self._host_table.shape[1]:
                grown = np.zeros((self._host_table.shape[0], width), dtype=np.int64)
                grown[:, :self._host_table.shape[1]] = self._host_table
                self._host_table = grown
            self._host_table[slot, :] = cols[0] if cols else 0
            self._host_table[slot, :len(cols)] = cols
            changed = True
            reg = self._registration(sampler, new.req_id, slot, p, plen)
            ledger = slot_ledger(runner)
            before = ledger.get(slot) or []
            prev = next((o for o in reversed(before) if o["req_id"] != new.req_id), None)
            reg["previous"] = None if prev is None else {
                k: prev[k] for k in ("req_id", "constraints", "params")}
            reg["slot_seen"] = len(before)  # earlier registrations in this slot the checks saw
            ledger.setdefault(slot, []).append({"req_id": new.req_id,
                                                "constraints": p.constraints(),
                                                "params": asdict(p)})
            self.registrations.append(reg)
        if changed:  # a fresh host buffer each time: the copy may still be in flight
            host = torch.from_numpy(self._host_table.copy())
            if self._dev.type == "cuda":
                host = host.pin_memory()
            self._table = host.to(self._dev, non_blocking=True)

    def _registration(self, sampler, req_id, slot, p, prompt_len) -> dict:
        """What vLLM's per-slot state holds for the request right after ``add_request``
        (host arrays; ``None`` where the installed version has no such array), and whether
        that registers each of the request's constraints (``missing``)."""
        got: dict[str, Any] = {"gate": None}
        if sampler is not None and hasattr(sampler, "needs_logits_processing"):
            got["gate"] = bool(sampler.needs_logits_processing[slot])
        for obj in _states(sampler):
            for a in REG_ATTRS:
                v = getattr(obj, a, None)
                arr = getattr(v, "np", v)
                if got.get(a) is None and isinstance(arr, np.ndarray) and arr.ndim == 1:
                    got[a] = arr[slot].item()
        missing = []
        known = lambda a: got.get(a) is not None

        def need(cond, name):
            if cond:
                missing.append(name)

        if p.allowed_token_ids is not None and known("num_allowed_token_ids"):
            need(got["num_allowed_token_ids"] != len(p.allowed_token_ids), "allowed_token_ids")
        if p.logit_bias and known("num_logit_bias"):
            need(got["num_logit_bias"] != len(p.logit_bias), "logit_bias")
        if p.min_tokens > 0 and p.masked_by_min_tokens and known("min_lens"):
            need(got["min_lens"] != prompt_len + p.min_tokens or
                 got.get("num_stop_token_ids") == 0, "min_tokens")
        if p.penalised and known("repetition_penalty"):
            need(not all(abs(got[a] - getattr(p, a)) < 1e-6 for a in
                         ("repetition_penalty", "frequency_penalty", "presence_penalty")
                         if known(a)), "penalties")
        if p.bad_words and known("num_bad_words"):
            need(got["num_bad_words"] != len(p.bad_words), "bad_words")
        row_changing = contracts.gated(p)  # the contracts behind the sampler's gate
        if row_changing and got["gate"] is False:
            missing.append("gate")
        tb = getattr(sampler, "thinking_budget_state", None)
        arr = getattr(getattr(tb, "thinking_token_budget", None), "np", None)
        if getattr(tb, "enabled", False) and isinstance(arr, np.ndarray) and arr.ndim == 1:
            got["thinking_token_budget"] = int(arr[slot])
        return {"req_id": req_id, "slot": slot, "constraints": p.constraints(),
                "missing": missing, "unasked": unasked(p, got, prompt_len), **got}

    # ---- the step ------------------------------------------------------------------------------
    def _before_step(self, runner, *a, **k):
        st = getattr(runner, "execute_model_state", None)
        batch = getattr(st, "input_batch", None) if st is not None else None
        self._begin(batch)

    def _final_step(self, _state):
        if self._step is not None:
            self._pending.append(self._step)
        self._step = None

    def _begin(self, batch) -> None:
        self._step = None
        if batch is None or not getattr(batch, "req_ids", None):
            return
        req_ids = list(batch.req_ids)
        if not any(r in self._history for r in req_ids) or self._nsteps >= self.max_steps:
            return
        cu = np.array(batch.cu_num_logits_np, copy=True)
        for r, n in zip(req_ids, np.diff(cu)):
            if r in self._len_ub:
                self._len_ub[r] += int(n)
        self._step = _Step(self._nsteps, req_ids, np.array(batch.idx_mapping_np, copy=True), cu,
                           getattr(batch, "cu_num_logits", None), out=self.outputs.current)
        self._nsteps += 1

    def _before_apply(self, sampler, *a, **k):
        step = self._step
        if step is None or self._table is None:
            return None
        return step, hookpoints.apply_sampling_args(a, k)

    def _after_apply(self, state, out, sampler, *a, **k):
        if state is not None:
            self._on_apply(sampler, state[0], state[1], out)

    def _on_apply(self, sampler, step: _Step, args, out) -> None:
        import torch

        logits = args.logits
        n, V = int(logits.shape[0]), int(logits.shape[-1])
        dev = logits.device
        offset = sum(c.n for c in step.calls)
        slots = args.expanded_idx_mapping.long()  # [n]
        static = self._table[slots]  # [n, S]
        all_tok = _all_tokens(sampler, self)
        w = max((self._len_ub.get(r, 0) for r in step.req_ids), default=1)
        w = max(1, min(int(all_tok.shape[1]), w))
        hist = all_tok[slots, :w].long()  # [n, W] the device history
        k = min(self.max_drafts, max(1, int(np.max(np.diff(step.cu))) - 1))
        lp = args.expanded_local_pos.long()
        ar = torch.arange(n, device=dev)
        didx = ((ar - lp).unsqueeze(1) + torch.arange(1, k + 1, device=dev)).clamp(0, n - 1)
        tokens = args.input_ids.long()
        drafts = tokens[didx]  # [n, k] the drafts of the row's request
        m = min(n, self.max_step_tokens)  # every token of the step: all requests' drafts
        step_tok = tokens[:m].unsqueeze(0).expand(n, m)
        kk = min(self.top_k, V)
        top = torch.topk(out.float(), kk, dim=-1)
        raw_top = torch.topk(logits, kk, dim=-1).indices
        cols = torch.cat([static, hist, drafts, step_tok, raw_top, top.indices], 1).clamp(0, V - 1)
        call = _Call(offset=offset, n=n, slots=args.expanded_idx_mapping.clone(),
                     local_pos=lp, input_ids=args.input_ids.clone(), cols=cols,
                     raw=logits.gather(1, cols).float(), proc=out.gather(1, cols).float(),
                     top2=top, w_static=int(static.shape[1]),
                     w_hist=w, fast_path=out is logits)
        slots_np = np.asarray(args.idx_mapping_np)
        call.gate_slots = np.array(slots_np, copy=True)
        g = getattr(sampler, "needs_logits_processing", None)
        call.gate = None if g is None else np.array(g[slots_np], copy=True)
        ps = [self.params.get(r) for r in step.req_ids]
        if any(p is not None and (p.allowed_token_ids is not None or p.json_schema is not None)
               for p in ps):
            call.finite = torch.isfinite(out).sum(-1)
        counts = _penalty_counts(sampler)
        if counts is not None and any(p is not None and p.penalised for p in ps):
            call.counts = counts[slots.unsqueeze(1), cols]
        step.calls.append(call)

    def _after_prompt_logprobs(self, _state, out, worker, *a, **k):
        self._on_prompt_logprobs(worker, a, k, out)

    def _on_prompt_logprobs(self, worker, a, k, out) -> None:
        """Per request of ours with ``prompt_logprobs`` whose prompt this step computes: the
        rows vLLM returned for this chunk (ids, values; the last rows of its tensor), the
        input token of each of the request's rows, and, from the same hidden states through
        the same ``logits_fn``, each row's logsumexp and values at the returned ids. The rows
        are located from the host prompt length and the batch's layout, not from vLLM's
        selection."""
        import torch

        names = ("logits_fn", "hidden_states", "input_batch")
        args = dict(zip(names, a))
        args.update({n: k[n] for n in names if n in k})
        batch = args["input_batch"]
        want = [(i, r) for i, r in enumerate(batch.req_ids)
                if r in self.params and self.params[r].prompt_logprobs is not None]
        if not want:
            return
        hs = args["hidden_states"]
        step = self._step.index if self._step is not None else None
        for i, r in want:
            plen = len(self.prompts[r])
            start = int(batch.num_computed_prefill_tokens_np[i])
            n = int(batch.num_scheduled_tokens[i])
            m = min(n, plen - 1 - start)  # rows at positions start.. predict start + 1..
            if start >= plen or m <= 0:
                continue
            lt = out.get(r) if isinstance(out, dict) else None
            if lt is None:
                chunks = getattr(worker, "in_progress_prompt_logprobs", {}).get(r) or []
                lt = chunks[-1] if chunks else None
            if lt is None:
                self.errors.append(f"compute_prompt_logprobs: step {step}: no prompt logprobs "
                                   f"for {r} at positions {start}..{start + m}")
                continue
            q0 = int(batch.query_start_loc_np[i])
            ids = lt.logprob_token_ids[-m:].long()
            logits = args["logits_fn"](hs[q0:q0 + m]).float()
            self._prompt_pending.append({
                "req_id": r, "step": step, "row": q0, "start": start, "m": m,
                "returned_rows": int(lt.logprob_token_ids.shape[0]),
                "input_ids": batch.input_ids[q0:q0 + m].clone(), "ids": ids.clone(),
                "vals": lt.logprobs[-m:].float().clone(),
                "at": logits.gather(1, ids.clamp(0, logits.shape[-1] - 1)),
                "lse": torch.logsumexp(logits, -1)})

    def prompt_rows(self, req_id: str) -> dict[int, dict]:
        """Prompt position ``q`` (1..) -> the row that predicts it: step, row, its input
        token, the ids and values vLLM returned for it, and what the row says at those ids
        (``truth``: ``contracts.expected_logprob`` per ``logprobs_mode``)."""
        self.materialize()
        return self._prompt_rows.get(req_id, {})

    # ---- after the run ------------------------------------------------------------------------
    def materialize(self) -> None:
        """Copy pending steps to the host and build the per-(step, request) records."""
        lost = self.outputs.errors if self.outputs is not None else []
        if len(lost) > self._outputs_errors:  # the shared output evidence this check reads
            self.errors += [f"outputs: {e}" for e in lost[self._outputs_errors:]]
            self._outputs_errors = len(lost)
        if not self._pending and not self._prompt_pending:
            return
        _sync()
        for c in self._prompt_pending:
            h = {k: to_host(c[k]) for k in ("input_ids", "ids", "vals", "at", "lse")}
            rows = self._prompt_rows.setdefault(c["req_id"], {})
            for t in range(min(c["m"], len(h["ids"]))):
                rows[c["start"] + t + 1] = {
                    "step": c["step"], "row": c["row"] + t, "input": int(h["input_ids"][t]),
                    "ids": [int(x) for x in h["ids"][t]],
                    "vals": [float(x) for x in h["vals"][t]],
                    "truth": [contracts.expected_logprob(self.logprobs_mode, float(v),
                                                         float(h["lse"][t]))
                              for v in h["at"][t]]}
        self._prompt_pending = []
        pending, self._pending = self._pending, []
        for step in pending:
            try:
                self._materialize(step)
            except Exception as e:
                self._error("materialize", e)

    def _materialize(self, step: _Step) -> None:
        h = to_host
        o = step.out
        sampled = None if o is None else o.host("sampled")
        ns = None if o is None else o.host("num_sampled")
        rows_out = {} if o is None else o.rows
        calls = []
        for c in step.calls:
            at, lp = rows_out.get(c.offset, (None, None))
            calls.append((c, {k: h(getattr(c, k)) for k in (
                "slots", "local_pos", "input_ids", "cols", "raw", "proc", "finite", "counts")},
                (h(c.top2[0]), h(c.top2[1])),
                None if at is None else (h(at[0]), h(at[1])),
                None if lp is None else tuple(h(x) for x in lp)))
        for i, req_id in enumerate(step.req_ids):
            if req_id not in self.params:
                continue
            r0, r1 = int(step.cu[i]), int(step.cu[i + 1])
            hist = self._history[req_id]
            prompt = self.prompts[req_id]
            n_s = int(ns[i]) if ns is not None else 0
            emitted = [int(t) for t in sampled[i, :n_s]] if sampled is not None else []
            rows = []
            for c, H, top, at, lp in calls:
                for r in range(max(r0, c.offset), min(r1, c.offset + c.n)):
                    rows.append(self._row(c, H, top, at, lp, r - c.offset, r - r0, req_id,
                                          hist, prompt, emitted))
            drafts = [row["input_token"] for row in rows[1:]]
            for row in rows:
                row["drafts"] = drafts
            self._steps.append({"step": step.index, "req_id": req_id, "slot": int(step.slots[i]),
                                "committed_before": len(hist) - len(prompt), "rows": rows,
                                "emitted": emitted, "num_rows": r1 - r0})
            hist.extend(emitted)

    def _row(self, c, H, top, at, lp, q, j, req_id, hist, prompt, emitted) -> dict:
        cols, raw, proc = H["cols"][q], H["raw"][q], H["proc"][q]
        s, w = c.w_static, c.w_hist
        dev_hist = [int(x) for x in cols[s:s + w]]
        n_hist = min(len(hist), w)
        slot = self.slot_of[req_id]
        row = {"row": c.offset + q, "local_pos": j, "input_token": int(H["input_ids"][q]),
               "gate": None if c.gate is None or slot not in c.gate_slots
               else bool(c.gate[list(c.gate_slots).index(slot)]),
               "fast_path": c.fast_path,
               "history_ok": dev_hist[:n_hist] == [int(t) for t in hist[:n_hist]],
               "top1": int(top[1][q][0]), "top1_val": float(top[0][q][0]),
               "top2_val": float(top[0][q][1]) if top[0].shape[1] > 1 else float("-inf"),
               "emitted_token": emitted[j] if j < len(emitted) else None}
        # every kept column, once, in the order static | history | drafts | step | top-K
        keep = list({int(x): i for i, x in reversed(list(enumerate(cols)))}.values())
        keep.sort()
        row["raw"] = {int(cols[x]): float(raw[x]) for x in keep}
        row["proc"] = {int(cols[x]): float(proc[x]) for x in keep}
        row["finite"] = None if H["finite"] is None else int(H["finite"][q])
        if H["counts"] is not None:
            row["counts"] = {int(cols[x]): int(H["counts"][q][x]) for x in keep}
        if at is not None and row["emitted_token"] is not None:
            row["raw_at_emitted"], row["proc_at_emitted"] = float(at[0][q]), float(at[1][q])
        if lp is not None:
            ids, vals, src_at, lse = lp
            row["logprob_ids"] = [int(x) for x in ids[q]]
            row["logprobs"] = [float(x) for x in vals[q]]
            row["logprob_truth"] = [contracts.expected_logprob(self.logprobs_mode, float(v),
                                                               float(lse[q])) for v in src_at[q]]
        return row

    # ---- the evidence, per step and request ------------------------------------------------------
    @property
    def steps(self) -> list[dict]:
        self.materialize()
        return self._steps

    def emitted_rows(self, req_id: str) -> list[dict]:
        """One entry per emitted token of ``req_id`` in output order: step, row, local
        position, token, and the row's logprob evidence."""
        out = []
        for rec in self.steps:
            if rec["req_id"] != req_id:
                continue
            for row in rec["rows"]:
                if row["emitted_token"] is not None:
                    out.append({"step": rec["step"], **{k: row.get(k) for k in (
                        "row", "local_pos", "emitted_token", "logprob_ids", "logprobs",
                        "logprob_truth", "top1_val", "top2_val")}})
        return out


def _states(sampler) -> list:
    """The sampler's per-slot state objects (0.31+: ``logits_processors``; older: attributes)."""
    if sampler is None:
        return []
    objs = list(getattr(sampler, "logits_processors", None) or [])
    objs += [v for k, v in vars(sampler).items() if k.endswith("_state") and v is not None]
    return objs


def _all_tokens(sampler, rc: RowCheck):
    rs = getattr(sampler, "req_states", None)
    t = getattr(getattr(rs, "all_token_ids", None), "gpu", None)
    if t is None:
        raise RuntimeError("no req_states.all_token_ids on the sampler")
    return t


def _penalty_counts(sampler):
    ps = getattr(sampler, "penalties_state", None)
    return getattr(ps, "output_bin_counts", None)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
