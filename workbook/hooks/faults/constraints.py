"""A catalogue of constraint faults: one raw patch per contract, so tests prove the row check
and the output check catch each at the exact row (``workbook.run.constraints.cases``).

Each fault is a ``PatchSet`` of layer "fault" (innermost: the row check sees its effects as it
would see a broken vLLM), removed with ``.remove()``. The shapes follow the public record
(``../shared/brief`` §9.4): a logits processor applied to the target row only (#42744's
shape), draft tokens not counted by the penalties (#29699's review), an off-by-one position
in min_tokens, a gate that skips processing, stop tokens in accepted drafts not trimmed on the
host, logprobs taken from the wrong row (#33391's shape), the budget's draft rows
(``H-d-draft`` of ``workbook.hooks.faults.budget``, unchanged), and a grammar bitmask skipped for one step.

- ``bias-target-row-only``     ``LogitBiasState.apply`` (allowed_token_ids, logit_bias,
                               min_tokens) leaves draft rows (local position >= 1) raw
- ``penalties-target-row-only`` ``PenaltiesState.apply`` leaves draft rows raw
- ``bad-words-target-row-only`` ``BadWordsState.apply`` leaves draft rows raw
- ``penalties-drafts-uncounted`` ``PenaltiesState.apply`` sees every local position as 0, so
                               a row's earlier drafts are not counted
- ``min-tokens-off-by-one``    the bias kernel reads each row's position + 1: the last row
                               that must mask stop/EOS does not
- ``gate-off``                 ``Sampler.add_request`` clears ``needs_logits_processing`` for
                               every request: the fast path returns the raw logits
- ``stop-not-trimmed``         the scheduler keeps the tokens after a stop token of the same
                               step (accepted drafts)
- ``logprobs-row-shift``       the rejection sampler's logprobs come from the next row
- ``budget-draft-rows``        ``H-d-draft``: the budget kernel never forces draft rows
- ``grammar-skipped-once``     ``StructuredOutputsWorker.apply_grammar_bitmask`` (MRV2 masks
                               the logits there, in ``GPUModelRunner.sample``, before the
                               sampler) returns without masking in the first step whose
                               bitmask constrains a row: that step's rows are unconstrained
- ``prompt-logprobs-row-shift`` ``PromptLogprobsWorker.compute_prompt_logprobs`` reads each
                               prompt position's logprobs from the next row's hidden state
- ``stop-string-not-trimmed``  vLLM 0.28–0.31's host behaviour on 0.32+: the detokenizer and
                               ``OutputProcessor`` keep the tokens (and their logprobs) after
                               the one completing a stop string within a step
                               (``_trim_surplus_tokens`` a no-op, ``update``'s cut undone)
- ``max-tokens-step-end``      the scheduler checks the length cap only at a step's last token:
                               a step's accepted drafts past ``max_tokens`` are kept
- ``penalties-next-column``    ``PenaltiesState.apply`` also applies the presence penalty one
                               column past each row's input token (an off-by-one column
                               index): a column outside the request's contract columns,
                               history and drafts
- ``allowed-mask-every-row``   ``LogitBiasState.apply`` reads every row's state from the
                               batch's first request with ``allowed_token_ids`` (a broadcast
                               slot index): its mask lands on its neighbours' rows

Version notes: written against MRV2's ``sample/`` state objects (0.31+: ``LogitsContext``; 0.28
generation: the same classes with positional arguments); a fault whose hook point is missing
raises ``patching``'s ``AttributeError`` naming it.
Not here: any knowledge used by the checks (they never read which fault was injected).
"""

from __future__ import annotations

import dataclasses
import importlib

from workbook.core import constraint_fault_catalogue as catalogue
from workbook.vllm import hookpoints, patching

PKG = "vllm.v1.worker.gpu.sample"
# the catalogue (names, what each breaks, the contract and stage it must be caught at) lives
# in core, so a run is validated without importing the hooks
FAULTS, EXPECTED = catalogue.FAULTS, catalogue.EXPECTED


def _cls(module: str, name: str):
    mod = importlib.import_module(f"{PKG}.{module}")
    cls = getattr(mod, name, None)
    if cls is None:
        raise AttributeError(f"{PKG}.{module}.{name} does not exist")
    return cls


def _ctx_of(a, k):
    """(logits, ctx) of a 0.31+ ``LogitsProcessor.apply(logits, ctx)``."""
    logits = a[0] if a else k["logits"]
    ctx = a[1] if len(a) > 1 else k["ctx"]
    return logits, ctx


def _target_rows_only(ps, cls):
    def make(orig):
        def apply(self, *a, **k):
            logits, ctx = _ctx_of(a, k)
            draft = (ctx.expanded_local_pos >= 1).unsqueeze(1)  # [rows, 1] device
            before = logits.clone()
            out = orig(self, *a, **k)
            out.copy_(before.where(draft, out))
            return out

        return apply

    ps.wrap(cls, "apply", make)


def _ctx_replaced(ps, cls, **fields):
    def make(orig):
        def apply(self, *a, **k):
            logits, ctx = _ctx_of(a, k)
            new = dataclasses.replace(ctx, **{n: f(ctx) for n, f in fields.items()})
            return orig(self, logits, new)

        return apply

    ps.wrap(cls, "apply", make)


def _gate_off(ps, hp):
    def make(orig):
        def add_request(self, *a, **k):
            out = orig(self, *a, **k)
            req_idx = a[0] if a else k["req_idx"]
            self.needs_logits_processing[req_idx] = False
            return out

        return add_request

    ps.wrap(hp.sampler, "add_request", make)


def _stop_not_trimmed(ps, hp):
    from vllm.v1.core.sched import utils
    from vllm.v1.core.sched.scheduler import Scheduler

    def make(orig):
        def _update_request_with_output(self, request, new_token_ids, *a, **k):
            stopped = False
            for tok in new_token_ids:
                request.append_output_token_ids(tok)
                stopped = stopped or utils.check_stop(request, self.max_model_len)
            return new_token_ids, stopped

        return _update_request_with_output

    ps.wrap(Scheduler, "_update_request_with_output", make)


def _logprobs_row_shift(ps, hp):
    def make(orig):
        def _get_logprobs_tensors(self, *a, **k):
            out = orig(self, *a, **k)
            if out is None:
                return out
            return out._replace(logprobs=out.logprobs.roll(-1, 0))

        return _get_logprobs_tensors

    ps.wrap(hp.rejection, "_get_logprobs_tensors", make)


def _grammar_skipped_once(ps):
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    done = []

    def make(orig):
        def apply_grammar_bitmask(self, logits, input_batch, grammar_req_ids, grammar_bitmask,
                                  *a, **k):
            # a row of the host bitmask other than all ones (-1) constrains its logits row
            if not done and grammar_req_ids and (grammar_bitmask != -1).any():
                done.append(True)
                return None
            return orig(self, logits, input_batch, grammar_req_ids, grammar_bitmask, *a, **k)

        return apply_grammar_bitmask

    ps.wrap(StructuredOutputsWorker, "apply_grammar_bitmask", make)


def _prompt_logprobs_row_shift(ps, hp):
    if hp.prompt_logprobs is None:
        raise AttributeError(f"{PKG}.prompt_logprob.PromptLogprobsWorker does not exist")

    def make(orig):
        def compute_prompt_logprobs(self, logits_fn, hidden_states, *a, **k):
            return orig(self, logits_fn, hidden_states.roll(-1, 0), *a, **k)

        return compute_prompt_logprobs

    ps.wrap(hp.prompt_logprobs, "compute_prompt_logprobs", make)


def _stop_string_not_trimmed(ps):
    from vllm.v1.engine import detokenizer, output_processor

    op = output_processor.OutputProcessor
    if "_trim_surplus_tokens" not in vars(op):
        raise AttributeError("vllm.v1.engine.output_processor.OutputProcessor."
                             "_trim_surplus_tokens does not exist (vLLM < 0.32 keeps the "
                             "tokens anyway)")
    ps.wrap(op, "_trim_surplus_tokens", lambda orig: staticmethod(lambda *a, **k: None))

    def make(orig):
        def update(self, new_token_ids, stop_terminated):
            n0, ids = len(self.token_ids), list(new_token_ids)
            out = orig(self, new_token_ids, stop_terminated)
            if out is not None:
                del self.token_ids[n0:]
                self.token_ids.extend(ids)
            return out

        return update

    ps.wrap(detokenizer.BaseIncrementalDetokenizer, "update", make)


def _penalties_next_column(ps, cls):
    def make(orig):
        def apply(self, *a, **k):
            import torch

            logits, ctx = _ctx_of(a, k)
            out = orig(self, *a, **k)
            rows = torch.arange(out.shape[0], device=out.device)
            col = (ctx.input_ids.long() + 1).clamp(max=out.shape[-1] - 1)
            pres = self.presence_penalty.gpu[ctx.expanded_idx_mapping.long()].to(out.dtype)
            out[rows, col] = out[rows, col] - pres
            return out

        return apply

    ps.wrap(cls, "apply", make)


def _allowed_mask_every_row(ps, cls):
    def make(orig):
        def apply(self, *a, **k):
            import torch

            logits, ctx = _ctx_of(a, k)
            n_allowed = getattr(self.num_allowed_token_ids, "np", None)
            if n_allowed is None:
                raise AttributeError("LogitBiasState.num_allowed_token_ids has no host array")
            slots = [int(s) for s in ctx.idx_mapping_np if n_allowed[int(s)] > 0]
            if not slots:
                return orig(self, *a, **k)
            mapping = torch.full_like(ctx.expanded_idx_mapping, slots[0])
            return orig(self, logits, dataclasses.replace(ctx, expanded_idx_mapping=mapping))

        return apply

    ps.wrap(cls, "apply", make)


def inject(name: str) -> patching.PatchSet:
    """Install fault ``name`` (``FAULTS``); returns its ``PatchSet`` (``.remove()`` undoes)."""
    if name not in FAULTS:
        raise ValueError(f"unknown constraint fault {name!r}; known: {sorted(FAULTS)}")
    if name == "budget-draft-rows":
        from workbook.hooks.faults import budget as faults

        return faults.inject("H-d-draft")
    hp = hookpoints.resolve()
    ps = patching.PatchSet(f"constraint-fault:{name}", "fault")
    if name == "bias-target-row-only":
        _target_rows_only(ps, _cls("logit_bias", "LogitBiasState"))
    elif name == "penalties-target-row-only":
        _target_rows_only(ps, _cls("penalties", "PenaltiesState"))
    elif name == "bad-words-target-row-only":
        _target_rows_only(ps, _cls("bad_words", "BadWordsState"))
    elif name == "penalties-drafts-uncounted":
        _ctx_replaced(ps, _cls("penalties", "PenaltiesState"),
                      expanded_local_pos=lambda c: c.expanded_local_pos.mul(0))
    elif name == "min-tokens-off-by-one":
        _ctx_replaced(ps, _cls("logit_bias", "LogitBiasState"), pos=lambda c: c.pos + 1)
    elif name == "gate-off":
        _gate_off(ps, hp)
    elif name == "stop-not-trimmed":
        _stop_not_trimmed(ps, hp)
    elif name == "logprobs-row-shift":
        _logprobs_row_shift(ps, hp)
    elif name == "grammar-skipped-once":
        _grammar_skipped_once(ps)
    elif name == "prompt-logprobs-row-shift":
        _prompt_logprobs_row_shift(ps, hp)
    elif name == "stop-string-not-trimmed":
        _stop_string_not_trimmed(ps)
    elif name == "max-tokens-step-end":
        _max_tokens_step_end(ps)
    elif name == "penalties-next-column":
        _penalties_next_column(ps, _cls("penalties", "PenaltiesState"))
    elif name == "allowed-mask-every-row":
        _allowed_mask_every_row(ps, _cls("logit_bias", "LogitBiasState"))
    elif name == "rejection-tempered-twice":
        _rejection_tempered_twice(ps)
    elif name == "draft-rows-untempered":
        _draft_rows_untempered(ps)
    return ps.install()


def _rejection_tempered_twice(ps):
    """``rejection_sampler.rejection_sample`` receives its target rows divided by each row's
    temperature once more (rows at temperature 0 or 1 unchanged): a sharper (T < 1) target
    distribution for every token the rejection sampler emits; greedy output is unchanged."""
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as rs

    def make(orig):
        def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos,
                             idx_mapping, expanded_idx_mapping, expanded_local_pos,
                             temperature, *a, **k):
            t = temperature[expanded_idx_mapping.long()].float()
            t = t.where((t != 0) & (t != 1), t.new_ones(())).unsqueeze(1)
            return orig(target_logits / t, draft_logits, draft_sampled, cu_num_logits, pos,
                        idx_mapping, expanded_idx_mapping, expanded_local_pos, temperature,
                        *a, **k)

        return rejection_sample

    ps.wrap(rs, "rejection_sample", make)


def _draft_rows_untempered(ps):
    """``Sampler.apply_sampling_params`` undoes the temperature on draft rows (local position
    >= 1; only the rejection sampler has them): those rows are sampled at T = 1."""
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    def make(orig):
        def apply_sampling_params(self, logits, expanded_idx_mapping, idx_mapping,
                                  idx_mapping_np, pos, input_ids, expanded_local_pos, *a, **k):
            out = orig(self, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos,
                       input_ids, expanded_local_pos, *a, **k)
            if out is logits:
                return out
            t = self.sampling_states.temperature.gpu[expanded_idx_mapping.long()].float()
            t = t.where((expanded_local_pos >= 1) & (t != 0), t.new_ones(())).unsqueeze(1)
            return out * t

        return apply_sampling_params

    ps.wrap(Sampler, "apply_sampling_params", make)


def _max_tokens_step_end(ps):
    """``Scheduler._update_request_with_output`` sees the request's cap lifted to the step's
    end for the step whose tokens cross it: the cap ends the request at the step's last token,
    so its accepted drafts past ``max_tokens`` are kept (finish reason still "length")."""
    from vllm.v1.core.sched.scheduler import Scheduler

    def make(orig):
        def _update_request_with_output(self, request, new_token_ids, *a, **k):
            cap = request.max_tokens
            end = request.num_output_tokens + len(new_token_ids)
            if end > cap:
                request.max_tokens = end
            try:
                return orig(self, request, new_token_ids, *a, **k)
            finally:
                request.max_tokens = cap

        return _update_request_with_output

    ps.wrap(Scheduler, "_update_request_with_output", make)
