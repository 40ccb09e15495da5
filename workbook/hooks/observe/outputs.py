"""The output evidence of each MRV2 step, recorded once for every collector that reads it.

``Outputs`` is a collector (``workbook.hooks.observe.observer``) that the tracer and the row check both
NEED (``Collector.needs``): an observer holding either holds one ``Outputs`` too, first in its
collector order, so its taps run before theirs at every hook point and each of them reads the
same record (``StepOutput``, ``Outputs.current`` during the step) instead of cloning the outputs
its own way. ``workbook.hooks.install`` puts it on the run's observer from the RunConfig
(``trace`` or ``row_check``). What it records, per step (device tensors, cloned inside the step,
never copied to the host there):

- always: the tokens ``GPUModelRunner.sample`` returned (``sampled``: what is emitted, after the
  guard when installed) and ``num_sampled`` (accepted drafts + 1 per request);
- ``want("steps")`` (the tracer): ``num_rejected``; the outermost ``Sampler`` /
  ``RejectionSampler`` call's own output (``sampled_vllm``: before the guard); the rows the guard
  replaced (``guard_fixed``);
- ``want("rows")`` (the row check): per ``apply_sampling_params`` call, the raw and processed
  values at the token emitted at each row (``at_tok``) and, for requests asking for logprobs, the
  ids and values vLLM returned per row with the row's own values there and its logsumexp
  (``lp``, read per ``logprobs_mode``).

Deliberately not here: the request and row evidence (``tracer``, ``rowcheck``), judging
(``workbook.run``). It never writes into vLLM tensors nor changes a return value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbook.hooks.observe.observer import Collector, Tap
from workbook.vllm import hookpoints

WANTS = ("steps", "rows")


def to_host(t):
    """A device tensor (or None / ndarray) as a numpy array (after the run: may synchronize)."""
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        return t
    return t.detach().cpu().numpy()


@dataclass
class StepOutput:
    """One step's outputs (device tensors until ``host``)."""
    req_ids: list
    cu: np.ndarray  # host cu_num_logits
    cu_dev: Any
    calls: list = field(default_factory=list)  # [offset, n, local_pos, raw, processed] (rows)
    sampled: Any = None  # [reqs, k+1] emitted (after the guard)
    num_sampled: Any = None  # [reqs]
    num_rejected: Any = None  # [reqs] ("steps")
    sampled_vllm: Any = None  # [reqs, k+1] the sampler's own, before the guard ("steps")
    num_sampled_vllm: Any = None
    guard_fixed: Any = None  # the guard's replaced rows ("steps")
    rows: dict = field(default_factory=dict)  # call offset -> (at_tok, lp) ("rows")
    path_seen: bool = False
    _host: dict = field(default_factory=dict)

    def host(self, name: str):
        """``name``'s tensor copied to the host once, whichever collector asks first."""
        if name not in self._host:
            self._host[name] = to_host(getattr(self, name))
        return self._host[name]


class Outputs(Collector):
    """The step's sampled / accepted / emitted tokens and logprobs, for the other collectors."""

    name = "outputs"

    def __init__(self):
        self.hp = hookpoints.resolve()
        self.wants: set[str] = set()
        self.known: set[str] = set()  # request ids registered while installed
        self.logprob_reqs: set[str] = set()  # ... that ask for logprobs
        self.logprobs_mode = "raw_logprobs"
        self.current: StepOutput | None = None
        self.errors: list[str] = []

    def want(self, *what: str) -> None:
        """A consumer's fields (``WANTS``); before the observer lists the taps."""
        bad = [w for w in what if w not in WANTS]
        if bad:
            raise ValueError(f"unknown output evidence {bad}; known: {WANTS}")
        self.wants.update(what)

    def error(self, where: str, e: Exception) -> None:
        self.errors.append(f"{where}: {type(e).__name__}: {e}"[:300])

    def taps(self) -> list[Tap]:
        hp = self.hp
        out = [Tap(hp.runner, "add_requests", after=self._after_add),
               Tap(hp.runner, "sample_tokens", before=self._before_step, final=self._final_step),
               Tap(hp.runner, "sample", after=self._after_sample)]
        if "steps" in self.wants:
            out += [Tap(hp.sampler, "__call__", before=self._path_before, after=self._path_after),
                    Tap(hp.rejection, "__call__", before=self._path_before,
                        after=self._path_after)]
        if "rows" in self.wants:
            out.append(Tap(hp.sampler, "apply_sampling_params", before=self._before_apply,
                           after=self._after_apply))
        return out

    # ---- taps -------------------------------------------------------------------------------
    def _after_add(self, _state, _out, runner, so, *a, **k):
        if not self.known:
            sampler = getattr(runner, "sampler", None)
            self.logprobs_mode = str(getattr(sampler, "logprobs_mode", None) or getattr(
                runner.model_config, "logprobs_mode", "raw_logprobs"))
        for new in so.scheduled_new_reqs:
            self.known.add(new.req_id)
            if getattr(new.sampling_params, "logprobs", None) is not None:
                self.logprob_reqs.add(new.req_id)
            else:
                self.logprob_reqs.discard(new.req_id)

    def _before_step(self, runner, *a, **k):
        self.current = None
        st = getattr(runner, "execute_model_state", None)
        batch = getattr(st, "input_batch", None) if st is not None else None
        if batch is None or not getattr(batch, "req_ids", None):
            return
        req_ids = list(batch.req_ids)
        if not any(r in self.known for r in req_ids):
            return  # a dummy / warm-up batch
        self.current = StepOutput(req_ids, np.array(batch.cu_num_logits_np, copy=True),
                                  getattr(batch, "cu_num_logits", None))

    def _final_step(self, _state):
        step, self.current = self.current, None
        if step is not None:
            for c in step.calls:  # release the logits
                c[3] = c[4] = None

    def _path_before(self, *a, **k):
        step = self.current
        if step is not None and not step.path_seen:
            step.path_seen = True  # the outermost sampler call of the step
            return step
        return None

    def _path_after(self, step, out, *a, **k):
        if step is not None:
            step.sampled_vllm = out.sampled_token_ids.clone()
            step.num_sampled_vllm = out.num_sampled.clone()

    def _before_apply(self, sampler, *a, **k):
        step = self.current
        if step is None:
            return None
        args = hookpoints.apply_sampling_args(a, k)
        return step, args.logits, args.expanded_local_pos

    def _after_apply(self, state, out, *a, **k):
        if state is not None:
            step, logits, local_pos = state
            offset = sum(c[1] for c in step.calls)
            step.calls.append([offset, int(logits.shape[0]), local_pos, logits, out])

    def _after_sample(self, _state, out, runner, *a, **k):
        step = self.current
        if step is None:
            return
        sampler_output, num_sampled = out[0], out[1]
        step.sampled = sampler_output.sampled_token_ids.clone()
        step.num_sampled = num_sampled.clone()
        if "steps" in self.wants:
            step.num_rejected = out[2].clone()
            fixed = getattr(getattr(runner, "_workbook_guard", None), "last_fixed", None)
            step.guard_fixed = fixed.clone() if fixed is not None else None
        if "rows" in self.wants:
            self._rows(step, sampler_output)

    def _rows(self, step: StepOutput, sampler_output) -> None:
        """Per apply call: raw / processed values at each row's emitted token, and the
        logprobs vLLM returned with the row's own values there (device work only)."""
        import torch

        sampled = sampler_output.sampled_token_ids
        lpt = getattr(sampler_output, "logprobs_tensors", None)
        want_lp = lpt is not None and any(r in self.logprob_reqs for r in step.req_ids)
        processed = self.logprobs_mode.startswith("processed")
        for offset, n, local_pos, raw, proc in step.calls:
            if raw is None:
                continue
            dev = raw.device
            rows = torch.arange(offset, offset + n, device=dev)
            cu = step.cu_dev
            if cu is None:
                cu = torch.as_tensor(step.cu, device=dev)
            bi = torch.searchsorted(cu[1:].long(), rows, right=True).clamp(max=sampled.shape[0] - 1)
            tok = sampled[bi, local_pos.clamp(max=sampled.shape[1] - 1)].long()
            tok = tok.clamp(0, raw.shape[-1] - 1)  # rows past num_sampled hold garbage
            at = (raw.gather(1, tok[:, None]).float()[:, 0],
                  proc.gather(1, tok[:, None]).float()[:, 0])
            lp = None
            if want_lp:
                src = proc if processed else raw
                ids = lpt.logprob_token_ids[offset:offset + n].long()
                lp = (ids, lpt.logprobs[offset:offset + n].float(),
                      src.float().gather(1, ids.clamp(0, src.shape[-1] - 1)),
                      torch.logsumexp(src.float(), -1))
            step.rows[offset] = (at, lp)
