"""The budget guard's take-back, host side: which rows it may take back, and with what.

Where the budget is not due (host truth) and vLLM forced the end anyway, the guard replaces that
token with the row's own draw without the forcing (the kernel: ``guard_kernel._take_back``).
This module keeps, per slot, what that draw depends on — from the request's ``SamplingParams``,
never from vLLM's device state — and builds, per step, the kernel's ``TakeBack`` (the logits
``ThinkingBudgetState.apply`` biased, its end columns before the forcing, and for sampled rows
temperature, seed and positions) and one mode per batch row: greedy (its argmax), sampled
(vLLM's seeded Gumbel draw: same seed, same position, same temperature, on the row without the
forcing), redrawn (a step the rejection sampler drew: its own draw of the step without the
forcing, ``guard_redraw``), or the reason the draw is not reproduced. vLLM promises a
reproducible draw only for a request with a seed; its top-k / top-p (every row of a batch where
one row asks) and min-p rewrite the row around the forced end. Such an end is kept and reported
"not taken back: <reason>" — never guessed.

Not here: the kernel, the host truth of the budget (``guard_state``), the hooks (``guard``).
"""

from __future__ import annotations

import numpy as np
import torch

from workbook.hooks.guard.kernel import (M_GREEDY, M_REDRAW, M_REDRAW_ROW, M_SAMPLED, R_DRAFTS,
                                         R_LAGGED, R_MASKED, R_NO_SEED, R_SAMPLER, TakeBack,
                                         gumbel_argmax)

REASONS = {  # reason code -> why an end forced where it was not due was kept
    R_NO_SEED: "the request has no seed (vLLM promises a reproducible draw only with one)",
    R_MASKED: "top-k, top-p or min-p rewrote the row around the forced end",
    R_DRAFTS: "the rejection sampler drew it and its draw without the forcing is not at hand "
              "(several verification chunks, logits replaced by top-k / top-p, or that draw "
              "differs from the step's tokens before the row)",
    R_SAMPLER: "this vLLM's sampler is not the seeded Gumbel sampler the guard reproduces",
    R_LAGGED: "the row's reasoning count came from the guard's replicas (its echo had not "
              "landed), not from the host",
}


def reason_text(code: int) -> str:
    """``not taken back: <reason>`` for a reason code of the echo."""
    return "not taken back: " + REASONS.get(int(code), f"reason code {int(code)}")


class SlotSampling:
    """Per slot, from ``SamplingParams`` at ``add_requests``: greedy, temperature, seed (and
    whether the user set one), min-p, top-k / top-p in use."""

    def __init__(self, n: int):
        self.greedy = np.zeros(n, dtype=bool)
        self.temp = np.zeros(n, dtype=np.float32)
        self.seed = np.zeros(n, dtype=np.int64)
        self.seeded = np.zeros(n, dtype=bool)
        self.min_p = np.zeros(n, dtype=bool)
        self.top_kp = np.zeros(n, dtype=bool)
        self.logprobs = np.zeros(n, dtype=bool)

    def stage(self, slot: int, sp) -> None:
        t = float(getattr(sp, "temperature", 1.0)) if sp is not None else 1.0
        self.greedy[slot] = t < 1e-5  # vLLM's own greedy threshold (SamplingParams)
        self.temp[slot] = 0.0 if self.greedy[slot] else t
        seed = getattr(sp, "seed", None) if sp is not None else None
        self.seeded[slot] = seed is not None
        self.seed[slot] = int(seed) if seed is not None else 0
        self.min_p[slot] = float(getattr(sp, "min_p", 0.0) or 0.0) != 0.0
        k = getattr(sp, "top_k", 0)
        p = getattr(sp, "top_p", 1.0)
        self.top_kp[slot] = (k is not None and int(k) > 0) or (p is not None and float(p) != 1.0)
        self.logprobs[slot] = getattr(sp, "logprobs", None) is not None if sp is not None \
            else False


def capture(captured: list, end_cols: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Before ``ThinkingBudgetState.apply`` biases ``logits`` ([num_logits, vocab], the tensor
    then sampled): keep it and its end-id columns' values (one device gather, no sync).
    Returns ``end_cols`` on the logits' device."""
    if end_cols.device != logits.device:
        end_cols = end_cols.to(logits.device)
    captured.append((logits, logits.index_select(1, end_cols).to(torch.float32)))
    return end_cols


_GUMBEL = None  # vLLM's gumbel_noised_argmax, looked up once (False: none)


def _has_gumbel() -> bool:
    global _GUMBEL
    if _GUMBEL is None:
        _GUMBEL = gumbel_argmax() is not None
    return bool(_GUMBEL)


def modes(sampling: SlotSampling, slots: np.ndarray, sc: np.ndarray, cu_np, drafts: bool,
          sampler_ok: bool, redraw: bool = False) -> np.ndarray:
    """One take-back mode per batch row (``M_GREEDY`` / ``M_SAMPLED`` / ``M_REDRAW`` / a
    reason ``R_*``); ``drafts``: the step verified drafts (rejection sampler); ``sampler_ok``:
    the runner's sampler is vLLM's seeded Gumbel sampler; ``redraw``: the rejection sampler's
    draw of this step without the forcing is at hand (``guard_redraw``)."""
    valid = slots >= 0
    one_row = np.zeros(slots.shape[0], dtype=bool)
    if cu_np is not None and len(cu_np) == slots.shape[0] + 1:
        one_row = np.diff(np.asarray(cu_np, dtype=np.int64)) == 1
    batch_kp = bool((sampling.top_kp[sc] & valid).any())
    out = np.full(slots.shape[0], R_SAMPLER, dtype=np.int32)
    out = np.where(drafts | ~one_row, R_DRAFTS, out)
    if sampler_ok and _has_gumbel():
        out = np.where(~(drafts | ~one_row), M_SAMPLED, out)
    if redraw:  # the rejection sampler drew every row of the step: its draw, redone (a row
        # asking for logprobs takes that row alone: vLLM computed logprobs for its own tokens)
        out = np.where(sampling.logprobs[sc], M_REDRAW_ROW, M_REDRAW).astype(np.int32)
    out = np.where(sampling.min_p[sc] | batch_kp, R_MASKED, out)
    out = np.where(~sampling.seeded[sc], R_NO_SEED, out)
    return np.where(sampling.greedy[sc], M_GREEDY, out).astype(np.int32)


def build(captured: list, input_batch, num_rows: int, mode: np.ndarray, sampling, sc,
          use_fp64: bool, redraw: tuple | None = None) -> tuple[TakeBack | None, bool]:
    """This step's ``TakeBack`` from the one apply call's capture when its rows are the
    batch's (``cu_num_logits``), else None; and whether the step's forcing could not be
    checked (apply ran more than once — the rejection sampler's chunks — or on other rows).
    ``redraw``: ``(sampled, num_sampled)`` of ``guard_redraw.redraw`` (``M_REDRAW`` rows)."""
    if not captured:
        return None, False
    cu_np = getattr(input_batch, "cu_num_logits_np", None)
    cu = getattr(input_batch, "cu_num_logits", None)
    logits, pre = captured[0]
    if len(captured) != 1 or cu is None or cu_np is None or len(cu_np) != num_rows + 1 \
            or int(cu_np[-1]) != int(logits.shape[0]):
        return None, True
    cu = cu.to(torch.int32) if cu.dtype != torch.int32 else cu
    dev = logits.device
    sampled_rows = mode != M_GREEDY
    if not sampled_rows.any():  # every row greedy: nothing was divided by a temperature
        return TakeBack(logits, pre, cu), False
    temp = to_device(sampling.temp[sc] * sampled_rows, dev)
    if redraw is not None and (mode >= M_REDRAW).any():
        return TakeBack(logits, pre, cu, temp=temp, redraw=redraw[0],
                        redraw_n=redraw[1].to(torch.int32)), False
    if not (mode == M_SAMPLED).any():
        return TakeBack(logits, pre, cu, temp=temp), False
    pos = input_batch.positions[input_batch.logits_indices]  # as vLLM's sampler reads it
    return TakeBack(logits, pre, cu, temp=temp, seed=to_device(sampling.seed[sc], dev),
                    pos=pos.to(torch.int64), use_fp64=use_fp64), False


def to_device(a: np.ndarray, dev) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dev.type == "cuda":
        return t.pin_memory().to(dev, non_blocking=True)
    return t.to(dev)
