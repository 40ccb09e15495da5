"""Defects written inside vLLM's own modules, as a real one would sit (a vLLM method replaced
for the duration), and deliberately NOT in the workbook's fault catalogue
(``workbook.hooks.faults``): the blame tests (tests/test_blame.py) judge them as faults nobody on
the team wrote the rules for. Each is a context manager; leaving it restores vLLM exactly.

- ``stale_allowed_mask``: ``LogitBiasState.add_request`` keeps the slot's allowed-ids count of
  the request that held the slot before when the new request asks for none (the ids stay on the
  device too); the kernel applies it whenever a neighbour in the batch needs it to run.
- ``stale_allowed_ids``: ``LogitBiasState.add_request`` skips rewriting a slot's allowed ids
  when the new request asks for as many as the slot's previous occupant had (an "unchanged"
  check on the count): the new request is masked with the previous occupant's ids.
- ``raised_column``: ``LogitBiasState.apply`` adds +3 at column 2777 of every row whose request
  uses no bias (no constraint binds it) — only in batches where a neighbour's bias makes the
  kernel run.
- ``stale_penalty_counts``: ``PenaltiesState.apply_staged_writes`` skips the recount of a newly
  registered request's prompt mask and output counts: it inherits the finished previous
  occupant's.
- ``budget_small_push(end)``: ``ThinkingBudgetState.apply`` adds +5 (not the +1e9 forcing) to
  the end column of every row of a budgeted request, due or not.
- ``end_raised_by_bias_stage(end, amount)``: ``LogitBiasState.apply`` (the stage before the
  budget's) adds ``amount`` (+5; ``end_forced_by_bias_stage``: +1e9) to the end column of
  every row.
"""

from __future__ import annotations

import contextlib

import numpy as np

COLUMN = 2777


@contextlib.contextmanager
def _replaced(cls, name, make):
    orig = cls.__dict__[name]
    setattr(cls, name, make(orig))
    try:
        yield
    finally:
        setattr(cls, name, orig)


def stale_allowed_mask():
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState

    def make(orig):
        def add_request(self, req_idx, sampling_params):
            left = int(self.num_allowed_token_ids.np[req_idx])
            out = orig(self, req_idx, sampling_params)
            if not sampling_params.allowed_token_ids:
                self.num_allowed_token_ids.np[req_idx] = left  # not cleared
            return out
        return add_request
    return _replaced(LogitBiasState, "add_request", make)


def stale_allowed_ids():
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState

    def make(orig):
        def add_request(self, req_idx, sampling_params):
            before = int(self.num_allowed_token_ids.np[req_idx])
            ids = sampling_params.allowed_token_ids
            if ids and before == len(ids):  # "unchanged": the ids' rewrite skipped
                self.num_allowed_token_ids.np[req_idx] = len(ids)
                self.use_logit_bias[req_idx] = True
                sampling_params = _without_allowed(sampling_params)
                orig(self, req_idx, sampling_params)
                self.num_allowed_token_ids.np[req_idx] = before
                self.use_logit_bias[req_idx] = True
                return True
            return orig(self, req_idx, sampling_params)
        return add_request
    return _replaced(LogitBiasState, "add_request", make)


def _without_allowed(sp):
    import copy

    sp = copy.copy(sp)
    sp.allowed_token_ids = None
    return sp


def raised_column():
    import torch
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState

    def make(orig):
        def apply(self, logits, ctx):
            out = orig(self, logits, ctx)
            if np.any(self.use_logit_bias[ctx.idx_mapping_np]):
                slots = ctx.expanded_idx_mapping.long().cpu().numpy()
                rows = np.nonzero(~self.use_logit_bias[slots])[0]
                if len(rows):
                    r = torch.as_tensor(rows, device=out.device)
                    out[r, COLUMN] += 3.0
            return out
        return apply
    return _replaced(LogitBiasState, "apply", make)


def stale_penalty_counts():
    from vllm.v1.worker.gpu.sample.penalties import PenaltiesState

    def make(orig):
        def apply_staged_writes(self):
            self._new_penalties_reqs.clear()  # no recount: the slot keeps the last one's
            return orig(self)
        return apply_staged_writes
    return _replaced(PenaltiesState, "apply_staged_writes", make)


def budget_small_push(end: int):
    import torch
    from vllm.v1.worker.gpu.sample.thinking_budget import ThinkingBudgetState

    def make(orig):
        def apply(self, logits, ctx):
            out = orig(self, logits, ctx)
            if getattr(self, "enabled", False):
                slots = ctx.expanded_idx_mapping.long().cpu().numpy()
                rows = np.nonzero(self.use_thinking_budget[slots])[0]
                if len(rows):
                    logits[torch.as_tensor(rows, device=logits.device), end] += 5.0
            return out
        return apply
    return _replaced(ThinkingBudgetState, "apply", make)


def end_raised_by_bias_stage(end: int, amount: float = 5.0):
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState

    def make(orig):
        def apply(self, logits, ctx):
            out = orig(self, logits, ctx)
            out[:, end] += amount
            return out
        return apply
    return _replaced(LogitBiasState, "apply", make)


BUDGET_DEFECTS = {"budget_small_push": budget_small_push,
                  "end_raised_by_bias_stage": end_raised_by_bias_stage,
                  "end_forced_by_bias_stage": lambda end: end_raised_by_bias_stage(end, 1e9)}
DEFECTS = {"stale_allowed_mask": stale_allowed_mask, "stale_allowed_ids": stale_allowed_ids, "raised_column": raised_column,
           "stale_penalty_counts": stale_penalty_counts}
