"""The budget guard's device side: the Triton kernel and its memory layout.

``workbook.hooks.guard`` holds the host truth and the hooks and calls ``launch`` once per guarded
step; its docstring gives the design and the processing order. This module: the layouts the host
and the kernel share (the truth row, the echo row, the repair-log entry, the replica), ``launch``
and ``launch_guard_kernel`` (the kernel over plain per-slot tensors: tests, benchmarks), and the
kernel itself — per batch row: (a) the slot's three replicas checked field by field against the
host's truth row, repaired and logged; (b) a row without a budget returns untouched, unless
the step's logits came with the launch (``TakeBack``); (c) the sampled tokens walked with the
truth's budget and count, the due end token forced at the first binding position — or, where
none is due, an end the forcing put there (its column >= 1e8, below before the forcing) taken
back with the row's own draw without the forcing (``_take_back``, a vocabulary scan only in
such a row): greedy, its argmax; sampled, vLLM's own seeded Gumbel draw (``gumbel_argmax``,
called) — or kept with a reason code where that draw is not reproduced — ``num_sampled`` /
``num_rejected`` fixed; (d) count and tail advanced into the replicas; (e) the echo row.

The kernel is the device twin of ``workbook.core.budget``'s rule (tested against vLLM's own
forcing kernel and the rule in ``tests/test_guard.py``). Not here: anything on the host.
"""

from __future__ import annotations

from typing import Any

import torch

from workbook.core import budget

# the truth row of one batch row: slot | budget | count | current | tail[TAIL]
T_SLOT, T_BUDGET, T_COUNT, T_CURRENT, T_TAIL = 0, 1, 2, 3, 4
# the echo row of one batch row: kept | replaced | repaired | taken back | not taken back |
# kept tokens (-1 padded); "replaced" counts every token the guard wrote, "taken back" those of
# them that replaced an end forced where it was not due, "not taken back" the reason code
# (``R_*``, 0: none) of the first such end the row kept because its draw is not reproduced
E_KEPT, E_FIXED, E_REPAIRED, E_TAKEN, E_UNTAKEN, E_TOKENS = 0, 1, 2, 3, 4, 5
# the take-back column of a truth row (``T_TAIL + TAIL``): how an end forced where it was not
# due is taken back — the row's own draw without the forcing, greedy (its argmax) or sampled
# (vLLM's seeded Gumbel draw, same seed / position / temperature) — or why it is not (``R_*``)
M_GREEDY, M_SAMPLED = 1, 2
R_NO_SEED, R_MASKED, R_DRAFTS, R_SAMPLER, R_LAGGED = 3, 4, 5, 6, 7
# sampled under speculative decoding: the row of vLLM's rejection sampler's own draw of the step
# without the forcing (``guard_redraw``), with the rest of that draw's step — or, for a request
# that asked for logprobs (vLLM computed them for its own tokens only), that row alone
M_REDRAW, M_REDRAW_ROW = 8, 9
FORCED_LOGIT = budget.FORCED_LOGIT  # a logit at or above it was set by a forcing bias
BLOCK_V = 1024  # vocabulary block of the take-back's argmax
# a device repair-log entry: seq | row | slot | field | found x3 | truth | truth from host
LOG_W = 9
F_BUDGET, F_COUNT, F_TAIL = 0, 1, 2  # field codes (the kernel's): tail position i is F_TAIL + i


def new_replica(max_num_reqs: int, tail_len: int, device) -> torch.Tensor:
    """One replica: flat int32 [max_num_reqs * (2 + tail_len)], all -1 (its own allocation)."""
    return torch.full((max_num_reqs * (2 + tail_len),), -1, dtype=torch.int32, device=device)


def replica_views(rep: torch.Tensor, max_num_reqs: int, tail_len: int):
    """(budget [n], count [n], tail [n, tail_len]) views of a replica."""
    n = max_num_reqs
    return rep[:n], rep[n:2 * n], rep[2 * n:].view(n, tail_len)


def marker_ids(x) -> tuple[int, ...]:
    """Marker ids as a tuple of Python ints (a tensor is read once: tests and benchmarks)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    return tuple(int(t) for t in x)


def launch(sampled, num_sampled, num_rejected, truth, replicas, max_num_reqs: int,
           tail_len: int, fixed_rows, counters, log, echo, seq: int, markers,
           take_back: "TakeBack | None" = None) -> None:
    """One program per row of ``sampled`` ([num_rows, k+1]); see the module docstring.
    ``truth``: int32 [num_rows, 4 + tail_len] (``T_*`` columns; with ``take_back`` one more,
    ``T_TAIL + tail_len``: the row's take-back mode, ``M_*`` or a reason ``R_*``); ``replicas``: three flat int32
    tensors (``new_replica`` layout); ``counters`` int32 [2]; ``log`` int32 [LOG_N, LOG_W];
    ``echo`` int32 [num_rows, >= E_TOKENS + k+1]; ``markers``: a ``budget.Markers`` (its ids
    become ``tl.constexpr`` tuples); ``take_back``: the step's processed logits and the end
    columns before the budget's forcing (None: an end forced where not due is left)."""
    _jit()
    from vllm.triton_utils import triton

    start, nat, end = marker_ids(markers.start), marker_ids(markers.natural_end), marker_ids(markers.end)
    if not (start and nat and end):
        raise ValueError(f"the guard needs start, natural-end and end ids, got {markers}")
    r0, r1, r2 = replicas
    k1 = int(sampled.shape[1])
    tb = take_back
    if tb is not None and tb.pre.shape[1] != len(end):
        raise ValueError(f"take_back.pre has {tb.pre.shape[1]} columns, the end ids {len(end)}")
    logits, pre, cu = (tb.logits, tb.pre, tb.cu_num_logits) if tb is not None else \
        (echo, echo, truth)  # not read: TAKE_BACK is off
    sampled_tb = tb is not None and tb.seed is not None
    temp = tb.temp if tb is not None and tb.temp is not None else echo  # not read without
    seed, pos = (tb.seed, tb.pos) if sampled_tb else (echo, echo)  # not read: SAMPLED off
    redraw_tb = tb is not None and tb.redraw is not None
    redraw, redraw_n = (tb.redraw, tb.redraw_n) if redraw_tb else (echo, echo)  # not read
    if redraw_tb and (redraw.shape[0] != sampled.shape[0] or redraw.shape[1] < k1):
        raise ValueError(f"take_back.redraw is {tuple(redraw.shape)}, the step's tokens "
                         f"{tuple(sampled.shape)}")
    _budget_guard_kernel[(int(sampled.shape[0]),)](
        sampled, sampled.stride(0), k1, num_sampled, num_rejected, truth, truth.stride(0),
        r0, r1, r2, max_num_reqs, fixed_rows, counters, log, log.shape[0], echo,
        echo.stride(0), seq, logits, logits.stride(0), int(logits.shape[1]), pre, cu, temp,
        seed, pos, redraw, redraw.stride(0), redraw_n,
        START_IDS=start, NAT_END_IDS=nat, END_IDS=end,
        START_LEN=len(start), NAT_END_LEN=len(nat), END_LEN=len(end), TAIL=tail_len,
        TAIL_P2=max(2, triton.next_power_of_2(tail_len)),
        K1_P2=max(2, triton.next_power_of_2(k1)), LOG_W=log.shape[1],
        TAKE_BACK=tb is not None, HAS_TEMP=tb is not None and tb.temp is not None,
        SAMPLED=sampled_tb, USE_FP64=bool(tb is not None and tb.use_fp64), REDRAW=redraw_tb,
        FORCED=FORCED_LOGIT, BLOCK_V=BLOCK_V, num_warps=1)


class TakeBack:
    """What the kernel needs to take back an end forced where it was not due: ``logits``, the
    processed logits rows the step sampled from ([num_logits, vocab], the tensor
    ``ThinkingBudgetState.apply`` biased, divided in place by the row's temperature after it);
    ``pre``, float32 [num_logits, len(end ids)], the values of the end-id columns before the
    budget's forcing; ``cu_num_logits`` int32 [num_rows + 1], the first logits row of each batch
    row (position j of row i is logits row ``cu_num_logits[i] + j``). For sampled rows:
    ``temp`` float32 [num_rows] (the request's temperature, 0 greedy), ``seed`` int64
    [num_rows] (its ``SamplingParams.seed``), ``pos`` int64 [num_logits] (the position each
    logits row samples, as vLLM's sampler reads it) and ``use_fp64`` (the sampler's Gumbel
    precision); ``seed`` None: no sampled row is taken back (``temp`` None: every row greedy).
    Under speculative decoding (``M_REDRAW`` rows): ``redraw`` [num_rows, >= k+1] and
    ``redraw_n`` int32 [num_rows], vLLM's rejection sampler's draw of the step on the rows
    without the forcing (``guard_redraw``)."""

    __slots__ = ("logits", "pre", "cu_num_logits", "temp", "seed", "pos", "use_fp64", "redraw",
                 "redraw_n")

    def __init__(self, logits, pre, cu_num_logits, temp=None, seed=None, pos=None,
                 use_fp64=False, redraw=None, redraw_n=None):
        self.logits, self.pre, self.cu_num_logits = logits, pre, cu_num_logits
        self.temp, self.seed, self.pos, self.use_fp64 = temp, seed, pos, use_fp64
        self.redraw, self.redraw_n = redraw, redraw_n


def launch_guard_kernel(sampled, num_sampled, num_rejected, idx_mapping, budget, count, tail,
                        fixed_rows, fixed_total, start_ids, natural_end_ids, end_ids,
                        take_back: "TakeBack | None" = None, greedy=None, mode=None) -> dict:
    """``launch`` with the host truth taken from separate per-slot ``budget`` [n] /
    ``count`` [n] / ``tail`` [n, TAIL] tensors and ``idx_mapping`` [num_rows] (row → slot,
    -1 padding), three replicas made from them (so nothing needs repair): tests and benchmarks;
    the engine path is ``GuardState.enforce``. ``take_back`` with ``greedy`` ([num_rows], 1:
    greedy row, else ``R_NO_SEED``) or ``mode`` ([num_rows], ``M_*`` / ``R_*``): see ``launch``. Updates ``count`` / ``tail`` and adds to ``fixed_total`` [1];
    returns the echo and the repair counter."""
    n, tail_len = budget.shape[0], tail.shape[1]
    dev = budget.device
    rep = torch.cat([budget.reshape(-1), count.reshape(-1), tail.reshape(-1)]).to(torch.int32)
    reps = [rep, rep.clone(), rep.clone()]
    idx = idx_mapping.long()
    ok = idx >= 0
    sc = idx.clamp(min=0)
    truth = torch.cat([idx_mapping.to(torch.int32)[:, None],
                       torch.where(ok, budget[sc], -1).to(torch.int32)[:, None],
                       count[sc].to(torch.int32)[:, None],
                       torch.ones_like(idx_mapping, dtype=torch.int32)[:, None],
                       tail[sc].to(torch.int32)]
                      + ([_modes(greedy, mode, dev)[:, None]]
                         if take_back is not None else []), dim=1).contiguous()
    counters = torch.zeros(2, dtype=torch.int32, device=dev)
    log = torch.zeros((16, LOG_W), dtype=torch.int32, device=dev)
    echo = torch.zeros((sampled.shape[0], E_TOKENS + sampled.shape[1]), dtype=torch.int32,
                       device=dev)
    launch(sampled, num_sampled, num_rejected, truth, reps, n, tail_len, fixed_rows, counters,
           log, echo, 0, budget_markers(start_ids, end_ids, natural_end_ids), take_back)
    b, c, t = replica_views(rep, n, tail_len)
    fixed_total += counters[0:1]
    count.copy_(c)
    tail.copy_(t)
    return {"echo": echo, "repairs": counters[1:2]}


def _modes(greedy, mode, dev) -> torch.Tensor:
    if mode is not None:
        return torch.as_tensor(mode, device=dev).to(torch.int32)
    g = torch.as_tensor(greedy, device=dev).to(torch.int32)
    return torch.where(g != 0, M_GREEDY, R_NO_SEED).to(torch.int32)


def budget_markers(start, end, natural_end) -> budget.Markers:
    return budget.Markers(marker_ids(start), marker_ids(end), marker_ids(natural_end))


# ----------------------------------------------------------------------------------------------
# the kernel
#
# ``_hist``, ``_vote``, ``_check`` and ``_budget_guard_kernel`` stay plain Python until the
# first launch: ``_jit()`` imports Triton through vLLM (after the CPU shim had its chance to set
# TRITON_INTERPRET) and rebinds the names, in this module's globals, to their ``triton.jit``
# versions, so that the kernel's calls resolve to the jitted helpers, compiled or interpreted.

tl: Any = None
_jitted = False


def jit() -> None:
    """Compile-on-first-use: bind this module's Triton functions (idempotent)."""
    _jit()


def count_rule():
    """The jitted ``_advance`` (the reasoning count after one token), for another kernel."""
    _jit()
    return _advance


def _jit() -> None:
    global tl, _hist, _vote, _check, _forced_end, _take_back, _budget_guard_kernel, _jitted
    global _advance
    global _gumbel_argmax
    if _jitted:
        return
    from vllm.triton_utils import HAS_TRITON, tl as _tl, triton

    if not HAS_TRITON:
        raise RuntimeError("the budget guard needs Triton; vLLM disabled it in this process (on a"
                           " CPU: WORKBOOK_TRITON_CPU=1 / workbook.vllm.env.prepare_process before"
                           " vLLM is imported)")
    tl = _tl
    _hist = triton.jit(_hist)
    _advance = triton.jit(_advance)
    _vote = triton.jit(_vote)
    _check = triton.jit(_check)
    _forced_end = triton.jit(_forced_end)
    _take_back = triton.jit(_take_back)
    _gumbel_argmax = gumbel_argmax()
    _budget_guard_kernel = triton.jit(_budget_guard_kernel)
    _jitted = True


def _hist(row_ptr, tail_ptr, TAIL: tl.constexpr, pos, cur_pos, cur_tok):
    # Token at relative position ``pos`` of the running history: pos >= 0 is this step's
    # row, pos < 0 the committed tail (TAIL + pos), pos == cur_pos the token being decided.
    in_row = pos >= 0
    a = tl.load(row_ptr + tl.maximum(pos, 0)).to(tl.int32)
    b = tl.load(tail_ptr + TAIL + tl.minimum(tl.maximum(pos, -TAIL), -1))
    tok = tl.where(in_row, a, b)
    tok = tl.where(pos < -TAIL, -1, tok)
    return tl.where(pos == cur_pos, cur_tok, tok)


def _advance(row_ptr, tail_ptr, TAIL: tl.constexpr, j, tok, count, START_IDS: tl.constexpr,
             START_LEN: tl.constexpr, NAT_END_IDS: tl.constexpr, NAT_END_LEN: tl.constexpr):
    # The reasoning count after token ``tok`` at row position ``j`` (``workbook.core.budget``):
    # +1 inside reasoning; a completed start marker restarts it at 0; a completed natural end
    # ends reasoning (-1) unless the last start lies inside it.
    count = tl.where(count >= 0, count + 1, count)
    s_match = True
    for q in tl.static_range(0, START_LEN):
        h = _hist(row_ptr, tail_ptr, TAIL, j - START_LEN + 1 + q, j, tok)
        s_match = s_match & (h == START_IDS[q])
    count = tl.where(s_match, 0, count)
    e_match = True
    for q in tl.static_range(0, NAT_END_LEN):
        h = _hist(row_ptr, tail_ptr, TAIL, j - NAT_END_LEN + 1 + q, j, tok)
        e_match = e_match & (h == NAT_END_IDS[q])
    return tl.where(e_match & (count >= 0) & (count + START_LEN >= NAT_END_LEN), -1, count)


def _vote(a, b, c):
    # Majority of three replicas (a when it agrees with one of the others, else b).
    return tl.where((a == b) | (a == c), a, b)


def _check(rep0_ptr, rep1_ptr, rep2_ptr, off, truth, from_host, counters_ptr, log_ptr, log_n,
           seq, req, slot, field, LOG_W: tl.constexpr):
    # One field of the slot's state: the three replicas against the truth. A field where any
    # replica differs is rewritten in all three and logged. Returns 1 when repaired, else 0.
    v0 = tl.load(rep0_ptr + off)
    v1 = tl.load(rep1_ptr + off)
    v2 = tl.load(rep2_ptr + off)
    bad = (v0 != truth) | (v1 != truth) | (v2 != truth)
    if bad:
        tl.store(rep0_ptr + off, truth)
        tl.store(rep1_ptr + off, truth)
        tl.store(rep2_ptr + off, truth)
        i = tl.atomic_add(counters_ptr + 1, 1)
        if i < log_n:
            e = log_ptr + i * LOG_W
            tl.store(e + 0, seq)
            tl.store(e + 1, req)
            tl.store(e + 2, slot)
            tl.store(e + 3, field)
            tl.store(e + 4, v0)
            tl.store(e + 5, v1)
            tl.store(e + 6, v2)
            tl.store(e + 7, truth)
            tl.store(e + 8, from_host)
    return bad.to(tl.int32)


def gumbel_argmax():
    """vLLM's own seeded Gumbel draw over one vocabulary block (``gumbel_noised_argmax`` of
    ``vllm.v1.worker.gpu.sample.gumbel``: the function its sampler's kernel calls per block,
    0.29 and 0.32 alike), or None where this vLLM has none (then no sampled row is taken back:
    ``R_SAMPLER``). Called, never copied: the take-back's draw is vLLM's draw."""
    try:
        from vllm.v1.worker.gpu.sample.gumbel import gumbel_noised_argmax
    except ImportError:
        return None
    return gumbel_noised_argmax


_gumbel_argmax: Any = None


def _forced_end(lrow_ptr, pre_ptr, tok, scale, END_IDS: tl.constexpr, END_LEN: tl.constexpr,
                FORCED: tl.constexpr):
    # ``tok`` is an end id whose column the forcing raised: >= FORCED now (times ``scale``, the
    # temperature the row was divided by since, 1 for greedy), < FORCED before the budget's apply
    forced = tok != tok
    for q in tl.static_range(0, END_LEN):
        raised = (tl.load(lrow_ptr + END_IDS[q]).to(tl.float32) * scale >= FORCED) & \
            (tl.load(pre_ptr + q) < FORCED)
        forced = forced | ((tok == END_IDS[q]) & raised)
    return forced


def _take_back(lrow_ptr, pre_ptr, vocab, tok, temp, seed, pos, SAMPLED: tl.constexpr,
               USE_FP64: tl.constexpr, END_IDS: tl.constexpr, END_LEN: tl.constexpr,
               FORCED: tl.constexpr, BLOCK_V: tl.constexpr):
    # The row's own draw with every raised end column back at its value before the forcing
    # (divided by ``temp`` as vLLM's temperature kernel did, for a sampled row): greedy, its
    # argmax (ties: the lowest column, as vLLM's greedy sampler); ``SAMPLED`` (temp > 0),
    # vLLM's seeded Gumbel draw per block of BLOCK_V (= vLLM's block), the first best block
    # winning (vLLM's ``argmax`` over the block maxima).
    best_v = tl.full([], float("-inf"), tl.float32)
    if USE_FP64:
        best_v = best_v.to(tl.float64)
    best_i = tok * 0
    scale = tl.where(temp > 0.0, temp, 1.0)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < vocab
        x = tl.load(lrow_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
        for q in tl.static_range(0, END_LEN):
            pre = tl.load(pre_ptr + q)
            raised = (tl.load(lrow_ptr + END_IDS[q]).to(tl.float32) * scale >= FORCED) & \
                (pre < FORCED)
            # vLLM's temperature kernel divides (and skips 0 and 1.0)
            back = tl.where((temp > 0.0) & (temp != 1.0), pre / scale, pre)
            x = tl.where(cols == END_IDS[q], tl.where(raised, back, x), x)
        if SAMPLED:
            bv, bi = _gumbel_argmax(x, cols, mask, seed, pos, temp, IS_DRAFTING=False,
                                    USE_FP64=USE_FP64, APPLY_TEMPERATURE=False)
        else:
            bv, bi = tl.max(x, axis=0, return_indices=True)
        take = bv > best_v
        best_i = tl.where(take, (v0 + bi).to(tl.int32), best_i)
        best_v = tl.where(take, bv, best_v)
    return best_i


def _budget_guard_kernel(
    sampled_ptr,  # [num_rows, k+1] tokens of this step, fixed in place
    sampled_stride,
    k1,  # k+1: columns of sampled
    num_sampled_ptr,  # [num_rows] int32, in place
    num_rejected_ptr,  # [num_rows] int32, in place
    truth_ptr,  # [num_rows, 4 + TAIL] int32 from the host: slot|budget|count|current|tail
    truth_stride,
    rep0_ptr,  # three replicas, each [max_reqs * (2 + TAIL)] int32:
    rep1_ptr,  # budget [max_reqs] | count [max_reqs] | tail [max_reqs, TAIL]
    rep2_ptr,
    max_reqs,
    fixed_rows_ptr,  # [num_rows] int32, tokens replaced per row (written by every program)
    counters_ptr,  # [2] int32: tokens replaced, repair-log entries reserved
    log_ptr,  # [log_n, LOG_W] int32 repair log
    log_n,
    echo_ptr,  # [num_rows, >= E_TOKENS + k1] int32: kept | replaced | repaired | taken back |
    # not taken back (reason) | kept tokens
    echo_stride,
    seq,  # the guard's launch counter (logged with each repair)
    logits_ptr,  # TAKE_BACK: [num_logits, vocab] the processed logits the step sampled from
    logits_stride,
    vocab,
    pre_ptr,  # TAKE_BACK: [num_logits, END_LEN] float32, the end columns before the forcing
    cu_ptr,  # TAKE_BACK: [num_rows + 1] int32, first logits row of each batch row
    temp_ptr,  # HAS_TEMP: [num_rows] float32, the request's temperature (0: greedy)
    seed_ptr,  # SAMPLED: [num_rows] int64, the request's SamplingParams.seed
    pos_ptr,  # SAMPLED: [num_logits] int64, the position each logits row samples
    redraw_ptr,  # REDRAW: [num_rows, >= k1] the rejection sampler's draw without the forcing
    redraw_stride,
    redraw_n_ptr,  # REDRAW: [num_rows] its num_sampled
    START_IDS: tl.constexpr,  # marker ids: compile-time constants, not device memory
    NAT_END_IDS: tl.constexpr,
    END_IDS: tl.constexpr,
    START_LEN: tl.constexpr,
    NAT_END_LEN: tl.constexpr,
    END_LEN: tl.constexpr,
    TAIL: tl.constexpr,
    TAIL_P2: tl.constexpr,
    K1_P2: tl.constexpr,
    LOG_W: tl.constexpr,
    TAKE_BACK: tl.constexpr,  # take back an end forced where it was not due
    HAS_TEMP: tl.constexpr,  # temp_ptr is given (else every row greedy)
    SAMPLED: tl.constexpr,  # some row is sampled and takeable: seed_ptr / pos_ptr are given
    USE_FP64: tl.constexpr,  # the sampler's Gumbel precision
    REDRAW: tl.constexpr,  # redraw_ptr / redraw_n_ptr are given (M_REDRAW rows)
    FORCED: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    req = tl.program_id(0)
    tl.store(fixed_rows_ptr + req, 0)
    echo_row = echo_ptr + req * echo_stride
    tl.store(echo_row + 0, 0)
    tl.store(echo_row + 1, 0)
    tl.store(echo_row + 2, 0)
    tl.store(echo_row + 3, 0)
    tl.store(echo_row + 4, 0)
    koffs = tl.arange(0, K1_P2)
    tl.store(echo_row + 5 + koffs, tl.full([K1_P2], -1, tl.int32), mask=koffs < k1)
    t_row = truth_ptr + req * truth_stride
    slot = tl.load(t_row + 0)
    if slot < 0:
        return
    budget = tl.load(t_row + 1)  # always the host's: whether and when this row is guarded
    h_count = tl.load(t_row + 2)
    current = tl.load(t_row + 3) != 0
    has_budget = budget >= 0
    count_off = max_reqs + slot
    tail_off = 2 * max_reqs + slot * TAIL
    # (a) the slot's device state against the truth
    nrep = _check(rep0_ptr, rep1_ptr, rep2_ptr, slot, budget, 1, counters_ptr, log_ptr, log_n,
                  seq, req, slot, 0, LOG_W)
    c_maj = _vote(tl.load(rep0_ptr + count_off), tl.load(rep1_ptr + count_off),
                  tl.load(rep2_ptr + count_off))
    c_host = current | (budget < 0)
    count = tl.where(budget < 0, -1, tl.where(current, h_count, c_maj))
    nrep += _check(rep0_ptr, rep1_ptr, rep2_ptr, count_off, count, c_host.to(tl.int32),
                   counters_ptr, log_ptr, log_n, seq, req, slot, 1, LOG_W)
    if has_budget:
        for i in tl.static_range(0, TAIL):
            t_maj = _vote(tl.load(rep0_ptr + tail_off + i), tl.load(rep1_ptr + tail_off + i),
                          tl.load(rep2_ptr + tail_off + i))
            t_true = tl.where(current, tl.load(t_row + 4 + i), t_maj)
            nrep += _check(rep0_ptr, rep1_ptr, rep2_ptr, tail_off + i, t_true,
                           current.to(tl.int32), counters_ptr, log_ptr, log_n, seq, req, slot,
                           2 + i, LOG_W)
    tl.store(echo_row + 2, nrep)
    tl.debug_barrier()
    # (b) a request without a budget (host truth) is never forced; without the take-back it
    # is not touched at all
    if budget < 0:
        if not TAKE_BACK:
            return
    # (c) enforcement with the truth's budget and count; the tail is replica 0's, now repaired
    n = tl.load(num_sampled_ptr + req)
    row_ptr = sampled_ptr + req * sampled_stride
    slot_tail_ptr = rep0_ptr + tail_off
    kept = n
    nfixed = n * 0
    ntaken = n * 0
    untaken = n * 0
    if TAKE_BACK:
        # the row's take-back mode; a lagged row's count is the replicas': never trusted to
        # take back
        mode = tl.load(t_row + 4 + TAIL)
        mode = tl.where(current | (budget < 0), mode, 7)  # R_LAGGED
        lrow0 = tl.load(cu_ptr + req)
        temp = tl.zeros([], tl.float32)
        if HAS_TEMP:
            temp = tl.load(temp_ptr + req).to(tl.float32)
        seed = tl.zeros([], tl.int64)
        if SAMPLED:
            seed = tl.load(seed_ptr + req).to(tl.int64)
    d_row = redraw_ptr + req * redraw_stride  # REDRAW only
    last = n * 0 - 1
    for j in range(0, k1):  # kept <= k1: n, or a redraw's num_sampled
        if j < kept:
            tok = tl.load(row_ptr + j).to(tl.int32)
            if has_budget & (count >= budget):  # count >= 0 here: in reasoning
                # end-sequence progress: longest proper prefix of END_IDS ending the history
                p = tok * 0
                for pl in tl.static_range(1, END_LEN):
                    match = True
                    for q in tl.static_range(0, pl):
                        h = _hist(row_ptr, slot_tail_ptr, TAIL, j - pl + q, j, tok)
                        match = match & (h == END_IDS[q])
                    p = tl.where(match, pl, p)
                forced = tok * 0 + END_IDS[0]
                for pl in tl.static_range(1, END_LEN):
                    forced = tl.where(p == pl, END_IDS[pl], forced)
                if tok != forced:
                    tl.store(row_ptr + j, forced.to(sampled_ptr.dtype.element_ty))
                    tok = forced
                    kept = j + 1
                    nfixed = nfixed + 1
            elif TAKE_BACK:
                # not due: an end the forcing put here is taken back with the row's own draw
                # without the forcing (``mode``), or kept with the reason; only an end id is
                # looked at
                is_end = tok != tok
                for q in tl.static_range(0, END_LEN):
                    is_end = is_end | (tok == END_IDS[q])
                if is_end:
                    lrow = (lrow0 + j).to(tl.int64)
                    lrow_ptr = logits_ptr + lrow * logits_stride
                    lpre_ptr = pre_ptr + lrow * END_LEN
                    if _forced_end(lrow_ptr, lpre_ptr, tok, tl.where(temp > 0.0, temp, 1.0),
                                   END_IDS, END_LEN, FORCED):
                        other = tok
                        if mode == 1:  # M_GREEDY
                            other = _take_back(lrow_ptr, lpre_ptr, vocab, tok, temp * 0.0, seed,
                                               lrow, False, False, END_IDS, END_LEN, FORCED,
                                               BLOCK_V)
                        elif SAMPLED:
                            if mode == 2:  # M_SAMPLED: vLLM's seeded draw on this row
                                other = _take_back(lrow_ptr, lpre_ptr, vocab, tok, temp, seed,
                                                   tl.load(pos_ptr + lrow), True, USE_FP64,
                                                   END_IDS, END_LEN, FORCED, BLOCK_V)
                        took = mode == 1
                        if SAMPLED:
                            took = took | (mode == 2)
                        rest = tok * 0 - 1  # a redraw's num_sampled: its rest of the step
                        if REDRAW:
                            if mode >= 8:  # M_REDRAW(_ROW): the rejection sampler's draw without
                                # the forcing, used where it drew this step's tokens before j
                                d_n = tl.load(redraw_n_ptr + req)
                                same = d_n > j
                                for i in range(0, j):
                                    same = same & (tl.load(d_row + i).to(tl.int32) ==
                                                   tl.load(row_ptr + i).to(tl.int32))
                                if same:
                                    took = mode >= 8
                                    other = tl.load(d_row + j).to(tl.int32)
                                    rest = tl.where(mode == 8, d_n, rest)
                                elif untaken == 0:
                                    untaken = n * 0 + 5  # R_DRAFTS: not that draw
                        if took:
                            if other != tok:
                                tl.store(row_ptr + j, other.to(sampled_ptr.dtype.element_ty))
                                tok = other
                                kept = j + 1
                                nfixed = nfixed + 1
                                ntaken = ntaken + 1
                                if rest > j + 1:  # the redraw's rest of the step
                                    for i in range(j + 1, rest):
                                        tl.store(row_ptr + i, tl.load(d_row + i).to(
                                            sampled_ptr.dtype.element_ty))
                                    kept = rest
                        elif untaken == 0:
                            untaken = tl.where((mode >= 3) & (mode <= 7), mode, 6)
            # advance the reasoning state over the kept token at position j
            count = _advance(row_ptr, slot_tail_ptr, TAIL, j, tok, count, START_IDS, START_LEN,
                             NAT_END_IDS, NAT_END_LEN)
            last = tok
    # (d) the replicas advance over the kept tokens (a request without a budget keeps -1)
    if has_budget:
        tl.store(rep0_ptr + count_off, count)
        tl.store(rep1_ptr + count_off, count)
        tl.store(rep2_ptr + count_off, count)
    if nfixed > 0:
        tl.store(num_sampled_ptr + req, kept)
        rej = tl.load(num_rejected_ptr + req)
        tl.store(num_rejected_ptr + req, rej + (n - kept))
        tl.store(fixed_rows_ptr + req, nfixed)
        tl.atomic_add(counters_ptr, nfixed)
    # (e) the echo: what the host's truth advances over
    tl.debug_barrier()
    toks = tl.load(row_ptr + koffs, mask=koffs < kept, other=-1).to(tl.int32)
    tl.store(echo_row + 5 + koffs, toks, mask=koffs < k1)
    tl.store(echo_row + 0, kept)
    tl.store(echo_row + 1, nfixed)
    tl.store(echo_row + 3, ntaken)
    tl.store(echo_row + 4, untaken)
    if has_budget & (kept > 0):
        # new tail = last TAIL tokens of (old tail ++ row[:kept])
        offs = tl.arange(0, TAIL_P2)
        valid = offs < TAIL
        pos = kept - TAIL + offs
        a = tl.load(row_ptr + tl.maximum(pos, 0), mask=valid & (pos >= 0), other=-1)
        b = tl.load(slot_tail_ptr + TAIL + tl.minimum(pos, -1), mask=valid & (pos < 0),
                    other=-1)
        vals = tl.where(pos >= 0, a.to(tl.int32), b)
        vals = tl.where(pos == kept - 1, last, vals)
        tl.debug_barrier()
        tl.store(rep0_ptr + tail_off + offs, vals, mask=valid)
        tl.store(rep1_ptr + tail_off + offs, vals, mask=valid)
        tl.store(rep2_ptr + tail_off + offs, vals, mask=valid)
