"""The budget guard's take-back under speculative decoding: the rejection sampler's own draw.

In a step that verifies drafts, vLLM's ``rejection_sample`` draws every row: each draft kept or
rejected by its seeded uniform, a rejected row resampled, the bonus row sampled. An end that the
budget's forcing put into such a row where the budget was not due (host truth) is taken back
with what that same function draws from the rows without the forcing. Right after vLLM's call,
when a row of the step may be taken back so (``M_REDRAW``: a sampled request with a seed and no
top-k / top-p / min-p, ``guard_takeback.modes``), ``redraw`` copies the processed logits, puts
back in the copy the end columns the budget's ``apply`` raised in every row where the budget is
not due — the host truth walked over the row's drafts with the guard kernel's own count rule
(``_restore_kernel``) — and calls vLLM's ``rejection_sample`` again on the copy: same drafts,
positions and draft logits, the request's own seed and temperature (``SamplingParams``). The
guard's kernel then takes that draw's row j, and the rest of that draw's step (``M_REDRAW``; a
request asking for logprobs, ``M_REDRAW_ROW``: row j alone, since vLLM computed logprobs for its
own tokens only), where the draw agrees with the step's tokens before j; else the end is kept,
"not taken back".

Cost: one more rejection sample, only in a step where a forced end can be one to take back —
an ``M_REDRAW`` row whose budget is not due at its first row by the host truth (where it is due,
every end the budget forces is the budget's own: ``needed``). No copy of the step's logits: the
end columns the forcing raised are put back in place (``unforced``) and the forced values
restored right after the draw (a [num_logits, len(end ids)] copy, not [num_logits, vocab]);
vLLM's ``rejection_sample`` only reads its ``target_logits``. Not done: more than one
verification chunk (vLLM splits above 1 GiB of logits), logits that top-k / top-p replaced by a
new tensor — no redraw there (``R_DRAFTS``).
Not here: the guard kernel (``guard_kernel``), the modes (``guard_takeback``), the hooks.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from workbook.hooks.guard import kernel as gk
from workbook.hooks.guard import takeback

_restore_kernel = None
_advance = None  # guard_kernel's count rule, jitted


def _restore(alt_ptr, alt_stride, logits_ptr, logits_stride, pre_ptr, cu_ptr, draft_ptr,
             truth_ptr, truth_stride, temp_ptr, MODE_COL: tl.constexpr,
             START_IDS: tl.constexpr, NAT_END_IDS: tl.constexpr, END_IDS: tl.constexpr,
             START_LEN: tl.constexpr, NAT_END_LEN: tl.constexpr, END_LEN: tl.constexpr,
             TAIL: tl.constexpr, FORCED: tl.constexpr):
    # One program per batch row of an M_REDRAW request: walk its logits rows with the host
    # truth's budget and count over its drafts (row j's history: the committed tail, then the
    # drafts rows 1..j verify); in a row where the budget is not due, every end column the
    # forcing raised (>= FORCED now, below it before apply) gets its value before the forcing
    # back in ``alt`` (divided by the row's temperature as vLLM's temperature kernel did).
    req = tl.program_id(0)
    t_row = truth_ptr + req * truth_stride
    slot = tl.load(t_row + 0)
    mode = tl.load(t_row + MODE_COL)
    budget = tl.load(t_row + 1)
    current = tl.load(t_row + 3) != 0
    if (slot < 0) | (mode < 8) | ~(current | (budget < 0)):  # M_REDRAW / M_REDRAW_ROW only
        return
    count = tl.where(budget < 0, -1, tl.load(t_row + 2))
    first = tl.load(cu_ptr + req)
    nrows = tl.load(cu_ptr + req + 1) - first
    drafts = draft_ptr + first + 1  # the token row j+1 verifies: row j's output if kept
    temp = tl.load(temp_ptr + req).to(tl.float32)
    scale = tl.where(temp > 0.0, temp, 1.0)
    go = nrows > 0
    for j in range(0, nrows):
        if go:
            lrow = (first + j).to(tl.int64)
            if ~((budget >= 0) & (count >= budget)):
                for q in tl.static_range(0, END_LEN):
                    v = tl.load(logits_ptr + lrow * logits_stride + END_IDS[q]).to(tl.float32)
                    pre = tl.load(pre_ptr + lrow * END_LEN + q)
                    back = tl.where((temp > 0.0) & (temp != 1.0), pre / scale, pre)
                    if (v * scale >= FORCED) & (pre < FORCED):
                        tl.store(alt_ptr + lrow * alt_stride + END_IDS[q], back)
            if j < nrows - 1:
                tok = tl.load(drafts + j).to(tl.int32)
                go = tok >= 0  # a placeholder ends verification
                count = _advance(drafts, t_row + 4, TAIL, j, tok, count, START_IDS, START_LEN,
                                    NAT_END_IDS, NAT_END_LEN)


def _jit():
    global _restore_kernel, tl, _advance
    if _restore_kernel is None:
        gk.jit()
        from vllm.triton_utils import tl as _tl, triton

        tl, _advance = _tl, gk.count_rule()
        _restore_kernel = triton.jit(_restore)
    return _restore_kernel


def unforced(logits: torch.Tensor, pre: torch.Tensor, cu: torch.Tensor, drafts: torch.Tensor,
             truth: torch.Tensor, temp: torch.Tensor, markers, tail_len: int) -> torch.Tensor:
    """The processed ``logits`` [num_logits, vocab], IN PLACE, with, in each row of an
    ``M_REDRAW`` batch row where the budget is not due, the end columns the forcing raised back
    at their values before it (``pre`` [num_logits, len(end ids)]); returns the end columns as
    they were ([num_logits, len(end ids)]) for ``forced_again``. ``cu`` [num_rows + 1] the first
    logits row of each batch row, ``drafts`` [num_logits] the tokens the rows verify (vLLM's
    ``draft_sampled``), ``truth`` int32 [num_rows, T_TAIL + tail_len + 1] (the guard's truth
    rows with the mode last), ``temp`` float32 [num_rows] (the row's temperature)."""
    ids = gk.marker_ids
    start, nat, end = ids(markers.start), ids(markers.natural_end), ids(markers.end)
    saved = logits.index_select(1, _end_index(end, logits.device))  # restored by forced_again
    _jit()[(int(cu.shape[0]) - 1,)](
        logits, logits.stride(0), logits, logits.stride(0), pre, cu.to(torch.int32), drafts,
        truth, truth.stride(0), temp, MODE_COL=int(truth.shape[1]) - 1, START_IDS=start,
        NAT_END_IDS=nat, END_IDS=end, START_LEN=len(start), NAT_END_LEN=len(nat),
        END_LEN=len(end), TAIL=tail_len, FORCED=gk.FORCED_LOGIT, num_warps=1)
    return saved


def forced_again(logits: torch.Tensor, saved: torch.Tensor, markers) -> None:
    """Put back the end columns ``unforced`` saved (the logits vLLM's later readers and the
    guard's kernel see are those the budget's ``apply`` left)."""
    logits.index_copy_(1, _end_index(gk.marker_ids(markers.end), logits.device), saved)


def needed(mode: np.ndarray, truth: np.ndarray) -> bool:
    """Whether a forced end can be one to take back in this step: an ``M_REDRAW`` row whose
    budget is not due at its first logits row by the host truth (no budget, or a count below
    it, or a count the host has not caught up with). Where the budget is due at the first row
    it is due at every later one (the count never falls): every end it forces is its own."""
    red = mode >= gk.M_REDRAW
    due = (truth[:, gk.T_BUDGET] >= 0) & (truth[:, gk.T_COUNT] >= truth[:, gk.T_BUDGET]) & \
        (truth[:, gk.T_CURRENT] != 0)
    return bool((red & ~due).any())


_SIGNATURES: dict = {}
_END_INDEX: dict = {}


def _end_index(end: tuple, dev) -> torch.Tensor:
    """The end ids as a device index (built once per ids and device: no host data per step)."""
    key = (end, str(dev))
    if key not in _END_INDEX:
        _END_INDEX[key] = torch.tensor(end, dtype=torch.int64, device=dev)
    return _END_INDEX[key]


def redraw(st, orig, args: tuple, kwargs: dict):
    """After vLLM's ``rejection_sample(*args, **kwargs)`` (``orig``) in a guarded step: its draw
    on the rows without the forcing, ``(sampled, num_sampled)`` — or None where no row of the
    step is ``M_REDRAW`` or the call is not the step's one verification of the captured logits.
    ``st``: the runner's ``GuardState`` (its capture, step rows, sampling and markers)."""
    sig = _SIGNATURES.get(orig)
    if sig is None:
        sig = _SIGNATURES[orig] = inspect.signature(orig)
    bound = sig.bind(*args, **kwargs)
    a = bound.arguments
    logits, cu = a["target_logits"], a["cu_num_logits"]
    caps, batch = st._captured, st._batch
    if batch is None or len(caps) != 1 or caps[0][0].data_ptr() != logits.data_ptr() \
            or tuple(caps[0][0].shape) != tuple(logits.shape):
        return None
    cu_np = getattr(batch, "cu_num_logits_np", None)
    num_rows = int(cu.shape[0]) - 1
    if cu_np is None or len(cu_np) != num_rows + 1 or int(cu_np[-1]) != int(logits.shape[0]):
        return None
    rows = st.step_rows(batch, num_rows)
    mode = takeback.modes(st.sampling, rows.slots, rows.sc, cu_np, True, st.sampler_ok,
                          redraw=True)
    if not needed(mode, rows.truth):
        return None
    dev = logits.device
    truth = np.concatenate([rows.truth, mode[:, None]], axis=1).astype(np.int32)
    truth_t = takeback.to_device(np.ascontiguousarray(truth), dev)
    temp_t = takeback.to_device(st.sampling.temp[rows.sc], dev)
    saved = unforced(logits, caps[0][1], cu, a["draft_sampled"], truth_t, temp_t, st.markers,
                     st.TAIL)
    a["temperature"] = takeback.to_device(st.sampling.temp, dev)  # per slot: the request's own
    a["seed"] = takeback.to_device(st.sampling.seed, dev)
    try:
        sampled, num_sampled = orig(*bound.args, **bound.kwargs)
    finally:
        forced_again(logits, saved, st.markers)
    return sampled, num_sampled
