"""The budget guard: enforce ``thinking_token_budget`` on the tokens MRV2 is about to commit.

vLLM enforces the thinking budget *before* sampling: ``ThinkingBudgetState.apply`` writes 1e9
into the end-marker column of the logits rows where the budget binds. Anything between that
write and the committed token (a fast path that skips logits processing, a disabled or
unregistered ``ThinkingBudgetState``, a stale device view of its UVA-backed budget, a sampler
that ignores the processed logits, synthetic acceptance, a frozen CUDA graph ...) can lose the
forcing, and #54906 is exactly such a loss. The guard checks the *result* instead: after
``GPUModelRunner.sample`` returned the step's tokens (Sampler or RejectionSampler, with or
without drafts) and before ``sample_tokens`` creates the ``AsyncOutput``, commits them
(``postprocess_sampled``) and lets the speculator propose from them, one Triton kernel walks
each request's sampled tokens with vLLM's own budget semantics and, at the first position where
the budget binds and the token is not the due end-marker token, writes that token, truncates
``num_sampled`` there and counts the dropped tokens as rejected (exactly what a rejected draft
looks like to the rest of MRV2). No sampling path can bypass it because it runs on what will
be committed.

Both directions. Where the budget is not due (host truth: before it binds, in a request without
a budget, or after reasoning ended) and vLLM forced the end anyway, the guard takes it back: a
sampled end id whose column in the logits row the step sampled from holds >= 1e8 while it held
less before ``ThinkingBudgetState.apply`` (the guard wraps ``apply`` to keep, on the device,
those columns' values before the forcing, and the tensor) is replaced, in a greedy row, by the
argmax of that row with the forced columns back at their values — what vLLM's greedy sampler
gives without the forcing — and the rest of the step follows as after any replacement (later
drafts rejected). The argmax runs in the kernel, only in a row being taken back (no host
sync). A sampled row (temperature > 0) is left: vLLM's random draw on the unforced row (after
top-k / top-p / min-p, or a rejection sampler's verification) is not reproduced; nor is a row
whose count is lagged (below).

Semantics (``vllm/v1/worker/gpu/sample/thinking_budget.py``, restated in
``workbook.core.budget``): for a position whose history (tokens before it) has ``n`` tokens
after the last reasoning start marker, and no natural end marker after that start, the budget
binds when ``n >= budget``; the token there must be ``end_ids[p]`` where ``p`` is the longest
proper prefix of ``end_ids`` the history already ends with. A natural end before the boundary
ends enforcement; multi-token end strings continue.

The host is the truth; the device state is checked against it. vLLM #54906 is a device write
nobody made (``ThinkingBudgetState``'s marker tensors zeroed, storage and ``_version``
unchanged), so nothing the guard decides *whether* and *when* to force with may come from
memory such a writer can reach:

- the marker ids are ``tl.constexpr`` tuples compiled into the kernel, never device tensors;
- the host keeps, per slot, the request's budget (from its ``SamplingParams``), and, for a
  request with a budget, its reasoning count and last ``TAIL`` tokens (``h_budget``,
  ``h_count``, ``h_tail``: numpy, no device memory), advanced from the tokens the guard itself
  emitted (see step 4);
- each guarded step passes that truth *with the launch*: one int32 row per batch row
  (``slot, budget, count, current, tail...``) staged in a pinned buffer and copied
  non-blocking; the slot is the guard's own record of which slot its request was added to
  (``req_id`` → slot at ``add_requests``), never vLLM's device ``idx_mapping``; one more
  column: the slot's request is greedy (its ``SamplingParams.temperature``);
- the device keeps the same per-slot state in three replicas (``GuardState.replicas``, each its
  own allocation), which the kernel checks field by field against the host's row and repairs;
  every repair is logged on the device (request row, slot, field, the three values found, the
  truth) and counted per row in the step's echo.

Processing order, per engine step:

1. ``add_requests`` (after vLLM's): drop finished and preempted requests from the guard's
   ``req_id`` → slot record (MRV2 frees their slots; a resumed request is added anew); for each new request read ``sampling_params.thinking_token_budget`` itself (never
   vLLM's ``ThinkingBudgetState``), its slot ``req_states.req_id_to_index[req_id]`` and
   ``prefill_token_ids``; set the host truth of that slot (budget, and for a budget the count
   and tail at the end of that history, from ``workbook.core.budget``); scatter the staged
   rows into the three replicas with one non-blocking H2D copy.
2. ``sample`` (after vLLM's; inside it ``apply`` left its logits and the end columns before
   the forcing: ``GuardState.capture``), host part: absorb every earlier step's echo whose
   copy has landed (``Event.query()``, never a wait) into the host truth (step 4); if no
   request of the batch has a budget (host truth) and apply did not run, return — nothing is
   launched and no request is touched. Else build
   the truth rows of the batch: budget always from the host; count and tail from the host,
   flagged ``current`` when every token this slot committed is on the host — else the kernel
   uses the majority of the replicas for them (only when an earlier step's echo has not landed
   yet: async scheduling; see below).
3. ``_budget_guard_kernel`` (``workbook.hooks.guard_kernel``), one program per batch row: (a)
   check the row's three replicas against the truth — budget, count (the host's ``-1`` for a request without a budget) and,
   for a budgeted request, each tail position; a field where any replica differs is rewritten
   in all three, logged, and counted; (b) a request the host says has no budget returns here,
   its tokens untouched whatever the device held (but an end forced into it, taken back);
   (c) walk the sampled tokens with the truth's budget and count, force the due end token at
   the first binding position or take back a forced end where none is due, truncate
   ``num_sampled`` / add to ``num_rejected``; (d) advance count and tail over the tokens kept
   into the replicas; (e) write the step's echo row: tokens kept, tokens replaced, fields
   repaired, tokens taken back, the kept tokens.
4. host, after the launch: one non-blocking D2H copy of the echo (pinned buffer + event; on a
   CPU the kernel has already run, so it is absorbed at once). Absorbing an echo advances each
   budgeted slot's host count / tail over its kept tokens (numpy for rows without a marker
   token, ``_advance`` — the kernel's walk on the host — for the others), adds the replaced
   tokens and repaired fields to the host counters, remembers which request each repaired row
   was (for the report), and warns once on vLLM's logger when device state was repaired.

Reporting (off the hot path, one sync): ``GuardState.report()`` → ``{"installed", "enabled",
"guarded_steps", "fixed_tokens" (every token replaced), "taken_back_tokens" (of them, ends
forced where not due), "untaken_steps" (apply ran more than once, or on other rows than the
batch's: no take-back tried), "repaired_fields", "repairs": [record ...], "repairs_dropped",
"truth_lagged_rows"}``; ``GuardState.repairs_table()`` → the same records as
a DataFrame with ``REPAIR_COLUMNS`` (the trace's ``guard`` table). A record: ``guard_step``
(the guard's launch counter), ``req_id``, ``slot``, ``row`` (batch row), ``total_len_before``
(committed tokens of the request before that step, joins the tracer's ``requests`` table),
``field`` (``budget`` / ``count`` / ``tail[i]``), ``found`` (the three replicas' values),
``truth`` and ``truth_from`` (``host``, or ``replica majority`` in a lagged step).

What it deliberately does not do: write logits (so logprobs of a replaced token are those of
the token vLLM had sampled), read or repair vLLM's budget state or its committed token history
(the host history it keeps is the guard's own output, copied in stream order right after the
kernel — identical to what vLLM commits unless something rewrites the sampled tokens after the
guard), guard requests that were added while it was not installed, wait for the device on the
hot path (no ``.item()``, no ``synchronize``; the echo is read when its event says it landed),
run Python per token except on rows whose kept tokens contain a marker token, or launch
anything for a batch in which no request has a budget and apply did not run (an unbudgeted
request is then simply not looked at: the guard never changes it, and its replicas are checked the next time it
shares a batch with a budgeted one). Under async scheduling, when a slot's previous echo has
not landed by the next launch, that one step's count and tail come from the replicas'
majority (a corruption of two or three replicas inside that window is repaired and reported
at the slot's next step with a current truth, after that one step's commit); the budget, and so whether a
request is guarded at all, always comes from the host. On healthy vLLM the kernel finds
nothing to fix or repair and outputs are token-identical.

Public API: ``install()`` / ``remove()`` / ``with enabled():``, ``patch_set()`` (the
``PatchSet`` named "guard", layer "guard"), ``state(runner)`` (the ``GuardState`` on a runner,
``runner._workbook_guard``), ``report(runner)`` / ``repairs_table(runner)``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from workbook.core import budget
from workbook.hooks.guard_kernel import (  # noqa: F401  (launch* re-exported: tests, benchmarks)
    E_FIXED, E_KEPT, E_REPAIRED, E_TAKEN, E_TOKENS, F_BUDGET, F_COUNT, F_TAIL, LOG_W, T_BUDGET,
    T_COUNT, T_CURRENT, T_SLOT, T_TAIL, TakeBack, new_replica, replica_views, budget_markers,
    launch, launch_guard_kernel)
from workbook.vllm.patching import PatchSet

ATTR = "_workbook_guard"  # GuardState lives on the runner instance under this name
_INT32_MAX = int(np.iinfo(np.int32).max)

LOG_N = 4096  # repair-log entries kept on the device; more are counted (``repairs_dropped``)

_patch_set: PatchSet | None = None
_generation = 0  # bumped on every install(): state staged under an older install is dropped
_sampling: "GuardState | None" = None  # the state whose runner's ``sample`` is running


# ----------------------------------------------------------------------------------------------
# host side: the reasoning state of a token history, from the one budget rule of
# ``workbook.core.budget`` (the kernel below is its device twin)

def reasoning_count(history: Sequence[int], markers: budget.Markers) -> int:
    """``budget.reasoning_count`` in the kernel's encoding: -1 when not in reasoning."""
    n = budget.reasoning_count(list(history), markers)
    return -1 if n is None else n


def _advance(count: int, tail: Sequence[int], tokens: Sequence[int], markers: budget.Markers,
             tail_len: int) -> tuple[int, list[int]]:
    """The kernel's walk on the host: (count, tail) after appending ``tokens`` to a history
    whose reasoning count is ``count`` (-1: not in reasoning) and whose last ``tail_len`` tokens
    are ``tail``. Tested against ``budget.reasoning_count`` on whole histories."""
    start, nat = list(markers.start), list(markers.natural_end)
    hist = [int(t) for t in tail]
    for tok in tokens:
        hist.append(int(tok))
        if count >= 0:
            count += 1
        if hist[-len(start):] == start:
            count = 0
        if hist[-len(nat):] == nat and count >= 0 and count + len(start) >= len(nat):
            count = -1  # a natural end ends reasoning unless the last start lies inside it
    return count, hist[-tail_len:]


@dataclass
class _Pending:
    """A launch whose echo is on its way to the host."""

    seq: int
    event: Any  # torch.cuda.Event, None when the echo is already on the host
    echo: torch.Tensor | None  # [num_rows, 3 + K1] int32, host (pinned on CUDA)
    slots: np.ndarray  # [num_rows] the guard's slot of each batch row (-1: not guarded)
    req_ids: tuple  # [num_rows]
    lens: np.ndarray  # [num_rows] committed tokens before the step (host truth)
    budgeted: np.ndarray  # [num_rows] bool: the row's request has a budget (its lens is kept)


class GuardState:
    """Per-runner guard state: the host truth, the guard's device replicas, the repair log.

    Host (numpy, per slot ``[max_num_reqs]``): ``h_budget`` (-1 = none), ``h_count`` (-1 = not
    in reasoning, or no budget), ``h_tail`` ``[max_num_reqs, TAIL]`` (last committed tokens,
    oldest first, -1 padded), ``h_len`` (committed tokens), ``lagged`` (an echo of this slot
    is still on its way); ``slot_of`` / ``req_of_slot`` (the guard's own req_id ↔ slot record).

    Device: ``replicas[k]`` (k = 0..2), flat int32 ``[max_num_reqs * (2 + TAIL)]`` =
    budget ``[max_num_reqs]`` | count ``[max_num_reqs]`` | tail ``[max_num_reqs, TAIL]`` —
    the kernel's working copy, checked against the host every guarded step; ``counters``
    int32 [2] (tokens replaced, log entries reserved); ``log`` int32 ``[LOG_N, LOG_W]``;
    ``fixed_rows`` int32 [max_num_reqs] (tokens replaced per batch row this step);
    ``echo`` int32 [max_num_reqs, 3 + K1] (the step's echo, copied to the host).

    ``budget`` / ``count`` / ``tail`` are replica 0's views.
    """

    def __init__(self, runner):
        self.markers = budget.Markers.of(getattr(runner.vllm_config, "reasoning_config", None))
        self.start_ids = list(self.markers.start)
        self.end_ids = list(self.markers.end)
        self.natural_end_ids = list(self.markers.natural_end)
        self.enabled = self.markers.complete
        self.device = runner.device
        self.max_num_reqs = int(runner.req_states.max_num_reqs)
        self.TAIL = max(len(self.start_ids) - 1, len(self.natural_end_ids) - 1,
                        len(self.end_ids) - 1, 1)
        self._marker_ids = np.array(sorted(set(self.start_ids + self.natural_end_ids
                                               + self.end_ids)) or [-2], dtype=np.int32)
        self.generation = _generation
        n, d, i32 = self.max_num_reqs, self.device, torch.int32
        self.replicas = [new_replica(n, self.TAIL, d) for _ in range(3)]
        self.budget, self.count, self.tail = replica_views(self.replicas[0], n, self.TAIL)
        self.fixed_rows = torch.zeros(n, dtype=i32, device=d)  # [max_num_reqs]
        self.counters = torch.zeros(2, dtype=i32, device=d)  # fixed tokens | log entries
        self.log = torch.zeros((LOG_N, LOG_W), dtype=i32, device=d)
        self.echo = torch.zeros((n, E_TOKENS + 1), dtype=i32, device=d)
        self._no_fix = torch.zeros(1, dtype=i32, device=d)  # last_fixed of a skipped step
        self._end_cols = torch.tensor(self.end_ids or [0], dtype=torch.long, device=d)
        self._last_fixed = self._no_fix
        self.profile: list | None = None  # benchmark: set to [] to time each guarded step
        self._reset_host()

    def _reset_host(self) -> None:
        n, tl_ = self.max_num_reqs, self.TAIL
        self.h_budget = np.full(n, -1, dtype=np.int32)
        self.h_count = np.full(n, -1, dtype=np.int32)
        self.h_tail = np.full((n, tl_), -1, dtype=np.int32)
        self.h_len = np.zeros(n, dtype=np.int64)
        self.h_greedy = np.zeros(n, dtype=bool)  # the slot's request samples greedily
        self.lagged = np.zeros(n, dtype=bool)
        self._captured: list = []  # this step's (logits, pre) from ThinkingBudgetState.apply
        self.slot_of: dict[str, int] = {}
        self.req_of_slot: list[str | None] = [None] * n
        self._staged: list[list[int]] = []  # rows [slot, budget, count, *tail]
        self._pending: collections.deque[_Pending] = collections.deque()
        self._repaired_steps: dict[int, _Pending] = {}  # seq -> the launch, for the report
        self.launches = 0
        self.fixed_tokens = 0  # host counters, from the echoes absorbed
        self.taken_back_tokens = 0  # of them: ends forced where not due, taken back
        self.untaken_steps = 0  # steps whose forcing could not be checked (several applies)
        self.repaired_fields = 0
        self.truth_lagged_rows = 0
        self._warned_at = 0

    @property
    def has_budget(self) -> np.ndarray:
        """Host truth: which slots hold a request with a budget ([max_num_reqs] bool)."""
        return self.h_budget >= 0

    # device views read by the tracer (no sync)
    @property
    def last_fixed(self) -> torch.Tensor:
        """Tokens replaced in the last step, per batch row ([num_reqs], or [1] zeros when the
        step had no request with a budget, or the guard is not installed now: the last step
        it guarded is not this one); sum it for the step's count."""
        if not installed() or self.generation != _generation:
            return self._no_fix
        return self._last_fixed

    @property
    def total_fixed(self) -> torch.Tensor:
        return self.counters[0:1]

    def reset(self) -> None:
        """Forget every slot and every count (device fills, no sync)."""
        with torch.inference_mode():  # the tensors were made in vLLM's inference mode
            for rep in self.replicas:
                rep.fill_(-1)
            self.counters.zero_()
        self._reset_host()
        self.generation = _generation

    # -- step 1: requests ---------------------------------------------------------------------
    def forget(self, req_ids) -> None:
        """Requests that finished: their slots are no longer this guard's to check."""
        for r in req_ids or ():
            s = self.slot_of.pop(r, None)
            if s is not None and self.req_of_slot[s] == r:
                self.req_of_slot[s] = None
                self.h_budget[s] = -1
                self.h_count[s] = -1

    def stage(self, slot: int, budget_value: int | None, history: Sequence[int],
              req_id: str | None = None, greedy: bool = False) -> None:
        b = -1 if budget_value is None or int(budget_value) < 0 \
            else min(int(budget_value), _INT32_MAX)
        cnt = reasoning_count(history, self.markers) if b >= 0 else -1
        tail = [int(t) for t in list(history)[-self.TAIL:]]
        tail = [-1] * (self.TAIL - len(tail)) + tail
        self._staged.append([int(slot), b, cnt, *tail])
        self.h_budget[slot], self.h_count[slot] = b, cnt
        self.h_tail[slot] = tail
        self.h_len[slot] = len(history)
        self.h_greedy[slot] = bool(greedy)
        self.lagged[slot] = False
        if req_id is not None:
            old = self.req_of_slot[slot]
            if old is not None and self.slot_of.get(old) == slot:
                del self.slot_of[old]
            self.slot_of[req_id] = int(slot)
            self.req_of_slot[slot] = req_id

    def flush(self) -> None:
        """Scatter the staged rows into the three replicas: one non-blocking H2D copy."""
        if not self._staged:
            return
        rows = torch.tensor(self._staged, dtype=torch.int32,
                            pin_memory=self.device.type == "cuda")  # [n_new, 3 + TAIL]
        self._staged = []
        rows = rows.to(self.device, non_blocking=True)
        slots = rows[:, 0].long()
        for rep in self.replicas:
            b, c, t = replica_views(rep, self.max_num_reqs, self.TAIL)
            b.index_copy_(0, slots, rows[:, 1])
            c.index_copy_(0, slots, rows[:, 2])
            t.index_copy_(0, slots, rows[:, 3:])

    # -- step 2a: what the budget's apply got (for the take-back) -----------------------------
    def capture(self, logits: torch.Tensor) -> None:
        """Before ``ThinkingBudgetState.apply`` biases ``logits`` ([num_logits, vocab], the
        tensor then sampled): keep it and the values of its end-id columns (one device gather,
        no sync)."""
        if logits.dim() != 2 or not self.end_ids:
            return
        if self._end_cols.device != logits.device:
            self._end_cols = self._end_cols.to(logits.device)
        pre = logits.index_select(1, self._end_cols).to(torch.float32)
        self._captured.append((logits, pre))

    def _take_back(self, input_batch, num_rows: int) -> TakeBack | None:
        """This step's ``TakeBack``: the one apply call's logits when their rows are the
        batch's (``cu_num_logits``); None when apply did not run, or ran more than once (the
        rejection sampler's chunks) or on other rows — then counted in ``untaken_steps``."""
        caps, self._captured = self._captured, []
        if not caps:
            return None
        cu_np = getattr(input_batch, "cu_num_logits_np", None)
        cu = getattr(input_batch, "cu_num_logits", None)
        logits, pre = caps[0]
        if len(caps) != 1 or cu is None or cu_np is None or len(cu_np) != num_rows + 1 \
                or int(cu_np[-1]) != int(logits.shape[0]):
            self.untaken_steps += 1
            return None
        return TakeBack(logits, pre, cu.to(torch.int32) if cu.dtype != torch.int32 else cu)

    # -- steps 2-4: enforcement ---------------------------------------------------------------
    def enforce(self, sampler_output, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                input_batch) -> None:
        """Fix this step's sampled tokens in place (no host sync)."""
        self._last_fixed = self._no_fix
        self.catch_up()
        sampled = sampler_output.sampled_token_ids  # [num_rows, k+1]
        num_rows = int(sampled.shape[0])
        req_ids = tuple(input_batch.req_ids)
        if num_rows == 0 or not req_ids:
            return
        slots = np.full(num_rows, -1, dtype=np.int32)
        get, m = self.slot_of.get, min(num_rows, len(req_ids))
        slots[:m] = [get(r, -1) for r in req_ids[:m]]
        sc = np.maximum(slots, 0)
        budgets = np.where(slots >= 0, self.h_budget[sc], -1)
        tb = self._take_back(input_batch, num_rows)
        if tb is None and not (budgets >= 0).any():
            return
        truth = np.empty((num_rows, T_TAIL + self.TAIL + 1), dtype=np.int32)  # 4+TAIL, greedy
        truth[:, T_SLOT] = slots
        truth[:, T_BUDGET] = budgets
        truth[:, T_COUNT] = self.h_count[sc]
        lag = self.lagged[sc] & (budgets >= 0)
        truth[:, T_CURRENT] = ~lag
        truth[:, T_TAIL:T_TAIL + self.TAIL] = self.h_tail[sc]
        truth[:, T_TAIL + self.TAIL] = (slots >= 0) & self.h_greedy[sc]
        self.truth_lagged_rows += int(lag.sum())
        truth_t = torch.from_numpy(truth)
        if self.device.type == "cuda":
            truth_t = truth_t.pin_memory().to(self.device, non_blocking=True)
        else:
            truth_t = truth_t.to(self.device)
        k1 = int(sampled.shape[1])
        if self.echo.shape[0] < num_rows or self.echo.shape[1] < E_TOKENS + k1:
            self.echo = torch.zeros((max(num_rows, self.max_num_reqs), E_TOKENS + k1),
                                    dtype=torch.int32, device=self.device)
        echo = self.echo[:num_rows]
        fixed_rows = self.fixed_rows[:num_rows] if num_rows <= self.fixed_rows.shape[0] else \
            torch.zeros(num_rows, dtype=torch.int32, device=self.device)
        seq = self.launches
        self.launches += 1
        launch(sampled, num_sampled, num_rejected, truth_t, self.replicas, self.max_num_reqs,
               self.TAIL, fixed_rows, self.counters, self.log, echo, seq, self.markers, tb)
        self._last_fixed = fixed_rows
        lens = self.h_len[sc].copy()
        if self.device.type == "cuda":
            host = torch.empty(tuple(echo.shape), dtype=torch.int32, pin_memory=True)
            host.copy_(echo, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self.lagged[slots[budgets >= 0]] = True
            self._pending.append(_Pending(seq, ev, host, slots, req_ids, lens, budgets >= 0))
        else:  # the interpreted kernel has run: absorb now
            self._absorb(_Pending(seq, None, echo.clone(), slots, req_ids, lens, budgets >= 0))

    def catch_up(self, wait: bool = False) -> None:
        """Absorb every echo that has landed (``wait``: all of them — one sync, off the hot
        path), in launch order."""
        while self._pending:
            p = self._pending[0]
            if p.event is not None:
                if wait:
                    p.event.synchronize()
                elif not p.event.query():
                    break
            self._pending.popleft()
            self._absorb(p)
        self.lagged[:] = False
        for p in self._pending:  # slots whose request still has tokens on their way
            for i, s in enumerate(p.slots.tolist()):
                if s >= 0 and i < len(p.req_ids) and self.req_of_slot[s] == p.req_ids[i]:
                    self.lagged[s] = True

    def _absorb(self, p: _Pending) -> None:
        echo = p.echo.numpy()  # [num_rows, 3 + K1]
        kept, fixed, repaired = echo[:, E_KEPT], echo[:, E_FIXED], echo[:, E_REPAIRED]
        self.fixed_tokens += int(fixed.sum())
        self.taken_back_tokens += int(echo[:, E_TAKEN].sum())
        n_rep = int(repaired.sum())
        if n_rep:
            self.repaired_fields += n_rep
            if len(self._repaired_steps) < LOG_N:  # each such step fills >= 1 log entry
                self._repaired_steps[p.seq] = _Pending(p.seq, None, None, p.slots, p.req_ids,
                                                       p.lens, p.budgeted)  # no echo kept
            self._warn(n_rep)
        # advance the host truth of each budgeted row still owned by the same request
        owned = np.array([s >= 0 and i < len(p.req_ids) and self.req_of_slot[s] == p.req_ids[i]
                          and self.h_budget[s] >= 0 for i, s in enumerate(p.slots)], dtype=bool)
        rows = np.nonzero(owned)[0]
        if rows.size == 0:
            return
        s = p.slots[rows]
        k = kept[rows].astype(np.int64)
        toks = echo[rows, E_TOKENS:]  # [n, K1], -1 past kept
        self.h_len[s] += k
        has_marker = (np.isin(toks, self._marker_ids) &
                      (np.arange(toks.shape[1])[None, :] < k[:, None])).any(axis=1)
        fast = ~has_marker
        if fast.any():
            fs, fk = s[fast], k[fast]
            c = self.h_count[fs]
            self.h_count[fs] = np.where(c >= 0, c + fk, c)
            cat = np.concatenate([self.h_tail[fs], toks[fast]], axis=1)
            self.h_tail[fs] = np.take_along_axis(cat, fk[:, None] + np.arange(self.TAIL)[None, :],
                                                 axis=1)
        for i in np.nonzero(has_marker)[0]:
            slot, n = int(s[i]), int(k[i])
            cnt, tail = _advance(int(self.h_count[slot]), self.h_tail[slot].tolist(),
                                 toks[i, :n].tolist(), self.markers, self.TAIL)
            self.h_count[slot] = cnt
            self.h_tail[slot] = tail

    def _warn(self, n: int) -> None:
        if self.repaired_fields >= 2 * self._warned_at:
            _log().warning(
                "workbook budget guard: %d field(s) of its device state differed from the host's "
                "truth and were repaired (%d in total) — device memory written by something "
                "else (vLLM #54906); details: guard.report(runner)", n, self.repaired_fields)
            self._warned_at = self.repaired_fields

    # -- reporting (syncs: not for the hot path) ----------------------------------------------
    def repairs(self) -> tuple[list[dict[str, Any]], int]:
        """Every repair the kernel logged, as records (see the module docstring), and how many
        were counted but not kept (log full)."""
        self.catch_up(wait=True)
        n = int(self.counters[1].item())
        log = self.log[:min(n, LOG_N)].cpu().numpy()
        out = []
        for seq, row, slot, fld, f0, f1, f2, truth, from_host in log.tolist():
            p = self._repaired_steps.get(seq)
            req_id = p.req_ids[row] if p is not None and row < len(p.req_ids) else None
            out.append({"guard_step": seq, "req_id": req_id, "slot": slot, "row": row,
                        "total_len_before": int(p.lens[row]) if p is not None
                        and self._budgeted(p, row) else None,
                        "field": _field_name(fld), "found": [f0, f1, f2], "truth": truth,
                        "truth_from": "host" if from_host else "replica majority"})
        out.sort(key=lambda r: (r["guard_step"], r["row"], r["field"]))
        return out, max(0, n - LOG_N)

    @staticmethod
    def _budgeted(p: _Pending, row: int) -> bool:
        return bool(p.budgeted[row]) if row < len(p.budgeted) else False

    def report(self, max_records: int | None = None) -> dict[str, Any]:
        """The guard's section of a verdict: what it fixed and repaired (one sync)."""
        recs, dropped = self.repairs()
        out = {"installed": installed(), "enabled": bool(self.enabled),
               "guarded_steps": self.launches, "fixed_tokens": self.fixed_tokens,
               "taken_back_tokens": self.taken_back_tokens, "untaken_steps": self.untaken_steps,
               "repaired_fields": self.repaired_fields,
               "repaired_requests": sorted({r["req_id"] for r in recs if r["req_id"]}),
               "repairs": recs if max_records is None else recs[:max_records],
               "repairs_dropped": dropped + (len(recs) - max_records
                                             if max_records is not None and
                                             len(recs) > max_records else 0),
               "truth_lagged_rows": self.truth_lagged_rows}
        return out

    def repairs_table(self):
        import pandas as pd

        recs, _ = self.repairs()
        return pd.DataFrame.from_records(recs, columns=__getattr__("REPAIR_COLUMNS"))

    def check_repairs(self) -> int:
        """Fields repaired so far (host counter, after absorbing every echo: one sync)."""
        self.catch_up(wait=True)
        return self.repaired_fields


def __getattr__(name: str):
    # ``REPAIR_COLUMNS``: the trace's ``guard`` table columns (``tracefiles.GUARD_COLUMNS``),
    # read lazily so that importing the guard (vLLM's worker processes) does not import pandas
    if name == "REPAIR_COLUMNS":
        from workbook.core import tracefiles

        return tracefiles.GUARD_COLUMNS
    raise AttributeError(name)


def _field_name(code: int) -> str:
    return {F_BUDGET: "budget", F_COUNT: "count"}.get(code, f"tail[{code - F_TAIL}]")


def _log():
    import logging

    return logging.getLogger("vllm.workbook.guard")  # printed by vLLM's own handler


# ----------------------------------------------------------------------------------------------
# the wrappers and the patch set

def state(runner, *, create: bool = False) -> GuardState | None:
    """The runner's ``GuardState`` (created on demand); stale state from an earlier install is
    reset."""
    st = runner.__dict__.get(ATTR)
    if st is None:
        if not create:
            return None
        st = GuardState(runner)
        setattr(runner, ATTR, st)
    if st.generation != _generation:
        st.reset()
    return st


def _w_add_requests(orig):
    @functools.wraps(orig)
    def add_requests(self, scheduler_output, *args, **kwargs):
        out = orig(self, scheduler_output, *args, **kwargs)
        new_reqs = scheduler_output.scheduled_new_reqs
        st = state(self, create=bool(new_reqs))
        if st is None or not st.enabled:
            return out
        st.forget(getattr(scheduler_output, "finished_req_ids", None))
        st.forget(getattr(scheduler_output, "preempted_req_ids", None))  # MRV2 removes them too;
        # a resumed request comes back as a new one (its prefill holds its outputs)
        for new_req_data in new_reqs:
            sp = new_req_data.sampling_params
            b = getattr(sp, "thinking_token_budget", None) if sp is not None else None
            slot = self.req_states.req_id_to_index[new_req_data.req_id]
            st.stage(slot, b, new_req_data.prefill_token_ids or [], new_req_data.req_id,
                     greedy=sp is not None and float(getattr(sp, "temperature", 1.0)) < 1e-5)
        st.flush()
        return out

    return add_requests


def _w_sample(orig):
    @functools.wraps(orig)
    def sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
        global _sampling
        st = state(self)
        if st is None or not st.enabled:
            return orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
        st._captured = []
        _sampling = st
        try:
            out = orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
        finally:
            _sampling = None
        sampler_output, num_sampled, num_rejected = out
        if st.profile is None:
            st.enforce(sampler_output, num_sampled, num_rejected, input_batch)
        else:
            _profiled_enforce(st, sampler_output, num_sampled, num_rejected, input_batch)
        return out

    return sample


def _w_budget_apply(orig):
    @functools.wraps(orig)
    def apply(self, *args, **kwargs):
        st = _sampling
        if st is not None and getattr(self, "enabled", False):
            logits = args[0] if args else kwargs.get("logits")
            if isinstance(logits, torch.Tensor):
                st.capture(logits)
        return orig(self, *args, **kwargs)

    return apply


def _profiled_enforce(st: GuardState, *args) -> None:
    """Benchmark path: record the guard's own time (CUDA events on a GPU, wall clock on CPU)."""
    if st.device.type == "cuda":
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host0 = time.perf_counter()
        t0.record()
        st.enforce(*args)
        t1.record()
        st.profile.append(("cuda", t0, t1, time.perf_counter() - host0))
    else:
        host0 = time.perf_counter()
        st.enforce(*args)
        st.profile.append(("cpu", None, None, time.perf_counter() - host0))


def patch_set() -> PatchSet:
    """The guard's ``PatchSet`` (built on first use; importing vLLM's runner module)."""
    global _patch_set
    if _patch_set is None:
        from workbook.vllm import hookpoints

        runner_cls = hookpoints.resolve().runner
        ps = PatchSet("guard", layer="guard")
        ps.wrap(runner_cls, "add_requests", _w_add_requests)
        ps.wrap(runner_cls, "sample", _w_sample)
        ps.wrap(hookpoints.resolve().budget, "apply", _w_budget_apply)
        _patch_set = ps
    return _patch_set


def install() -> PatchSet:
    """Install the guard (idempotent). Requests added from now on are guarded."""
    global _generation
    ps = patch_set()
    if not ps.installed:
        _generation += 1
        ps.install()
    return ps


def remove() -> None:
    """Remove the guard; vLLM's methods are restored identically."""
    if _patch_set is not None:
        _patch_set.remove()


def installed() -> bool:
    return _patch_set is not None and _patch_set.installed


@contextlib.contextmanager
def enabled():
    """``with guard.enabled(): ...`` — installed inside, restored to the previous state after."""
    was = installed()
    install()
    try:
        yield patch_set()
    finally:
        if not was:
            remove()


def report(runner, max_records: int | None = None) -> dict[str, Any]:
    """The guard's verdict section for ``runner`` (one sync); ``{"installed": False, ...}``
    when it never ran there under the current install."""
    st = runner.__dict__.get(ATTR) if runner is not None else None
    if st is None or st.generation != _generation:
        return {"installed": installed(), "enabled": None, "guarded_steps": 0,
                "fixed_tokens": 0, "taken_back_tokens": 0, "untaken_steps": 0, "repaired_fields": 0, "repaired_requests": [],
                "repairs": [], "repairs_dropped": 0, "truth_lagged_rows": 0}
    return st.report(max_records)


def repairs_table(runner):
    """The trace's ``guard`` table for ``runner``: one row per repair (``REPAIR_COLUMNS``)."""
    import pandas as pd

    st = runner.__dict__.get(ATTR) if runner is not None else None
    if st is None or st.generation != _generation:
        return pd.DataFrame(columns=__getattr__("REPAIR_COLUMNS"))
    return st.repairs_table()


def describe(runner) -> dict[str, Any]:
    """Small host-side summary for notebooks (syncs: not for the hot path)."""
    st = state(runner)
    if st is None:
        return {"installed": installed(), "state": None}
    rep = st.report(max_records=0)
    return {"installed": installed(), "enabled": st.enabled, "start_ids": st.start_ids,
            "end_ids": st.end_ids, "natural_end_ids": st.natural_end_ids, "tail_len": st.TAIL,
            "slots_with_budget": int(st.has_budget.sum()),
            "total_fixed": rep["fixed_tokens"], "repaired_total": rep["repaired_fields"]}
