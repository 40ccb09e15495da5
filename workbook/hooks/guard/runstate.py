"""The budget guard's state on one runner: the host truth, the device replicas, the echo.

``GuardState`` (one per ``GPUModelRunner``, ``runner._workbook_guard``) keeps, per request
slot, the host's truth of the thinking budget (budget, reasoning count, last tokens, from the
request's ``SamplingParams`` and prefill, advanced from the tokens the guard itself kept), the
device replicas the kernel checks against it, and the repair log; per step ``enforce`` builds
the truth rows of the batch, launches the kernel (``guard_kernel.launch``) without a host sync
and absorbs each step's echo once its copy has landed. The take-back's inputs (sampling
parameters per slot, the captured logits, the mode per row) come from ``guard_takeback``. The
design, the processing order and the report's fields: ``workbook.hooks.guard``'s docstring.

Not here: the patches on vLLM's methods and the public install API (``guard``), the kernel
(``guard_kernel``). ``reasoning_count`` / ``advance`` are the host twins of the kernel's walk.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np
import torch

from workbook.core import budget
from workbook.hooks.guard import takeback
from workbook.hooks.guard.kernel import (
    E_FIXED, E_KEPT, E_REPAIRED, E_TAKEN, E_TOKENS, E_UNTAKEN, F_BUDGET, F_COUNT, F_TAIL, LOG_W,
    T_BUDGET, T_COUNT, T_CURRENT, T_SLOT, T_TAIL, new_replica, replica_views, launch)

# the install this state belongs to: ``guard.install()`` bumps ``generation`` (state staged
# under an older install is dropped); ``installed()``: whether the guard's patches are in place
# (``guard`` sets it to its own ``installed``)
INSTALL = SimpleNamespace(generation=0, installed=lambda: False)
UNTAKEN_KEPT = 256  # "not taken back" records kept for the report; more are counted

ATTR = "_workbook_guard"  # GuardState lives on the runner instance under this name
_INT32_MAX = int(np.iinfo(np.int32).max)

LOG_N = 4096  # repair-log entries kept on the device; more are counted (``repairs_dropped``)



# ----------------------------------------------------------------------------------------------
# host side: the reasoning state of a token history, from the one budget rule of
# ``workbook.core.budget`` (the kernel below is its device twin)

def reasoning_count(history: Sequence[int], markers: budget.Markers) -> int:
    """``budget.reasoning_count`` in the kernel's encoding: -1 when not in reasoning."""
    n = budget.reasoning_count(list(history), markers)
    return -1 if n is None else n


def advance(count: int, tail: Sequence[int], tokens: Sequence[int], markers: budget.Markers,
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
    echo: torch.Tensor | None  # [num_rows, E_TOKENS + K1] int32, host (pinned on CUDA)
    slots: np.ndarray  # [num_rows] the guard's slot of each batch row (-1: not guarded)
    req_ids: tuple  # [num_rows]
    lens: np.ndarray  # [num_rows] committed tokens before the step (host truth)
    budgeted: np.ndarray  # [num_rows] bool: the row's request has a budget (its lens is kept)


@dataclass
class StepRows:
    """One step's batch rows against the host truth (``GuardState.step_rows``)."""

    slots: np.ndarray  # [num_rows] int32, the guard's slot of each row (-1: not its request)
    sc: np.ndarray  # [num_rows] slots clipped at 0 (for indexing per-slot arrays)
    budgets: np.ndarray  # [num_rows] the host's budget (-1: none)
    truth: np.ndarray  # [num_rows, T_TAIL + TAIL] int32 truth rows (no mode column)
    lag: np.ndarray  # [num_rows] bool: count / tail come from the replicas (echo not landed)


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
    ``echo`` int32 [max_num_reqs, E_TOKENS + K1] (the step's echo, copied to the host).

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
        self.generation = INSTALL.generation
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
        sampler = getattr(runner, "sampler", None)  # vLLM's seeded Gumbel sampler (a subclass,
        # e.g. a watermarking one, draws otherwise: its sampled rows are not taken back)
        self.sampler_ok = sampler is not None and type(sampler).__name__ == "Sampler" and \
            type(sampler).__module__ == "vllm.v1.worker.gpu.sample.sampler"
        self.use_fp64 = bool(getattr(sampler, "use_fp64_gumbel", False))
        self._reset_host()

    def _reset_host(self) -> None:
        n, tl_ = self.max_num_reqs, self.TAIL
        self.h_budget = np.full(n, -1, dtype=np.int32)
        self.h_count = np.full(n, -1, dtype=np.int32)
        self.h_tail = np.full((n, tl_), -1, dtype=np.int32)
        self.h_len = np.zeros(n, dtype=np.int64)
        self.sampling = takeback.SlotSampling(n)  # what the take-back's draw depends on
        self.lagged = np.zeros(n, dtype=bool)
        self._captured: list = []  # this step's (logits, pre) from ThinkingBudgetState.apply
        self._batch = None  # this step's input batch, while ``sample`` runs
        self._rows: tuple | None = None  # this step's (num_rows, StepRows), once built
        self._redraws: list = []  # this step's rejection_sample calls: their redraw or None
        self.slot_of: dict[str, int] = {}
        self.req_of_slot: list[str | None] = [None] * n
        self._staged: list[list[int]] = []  # rows [slot, budget, count, *tail]
        self._pending: collections.deque[_Pending] = collections.deque()
        self._repaired_steps: dict[int, _Pending] = {}  # seq -> the launch, for the report
        self.launches = 0
        self.fixed_tokens = 0  # host counters, from the echoes absorbed
        self.taken_back_tokens = 0  # of them: ends forced where not due, taken back
        self.untaken_steps = 0  # steps whose forcing could not be checked (several applies)
        self.untaken_rows = 0  # rows that kept an end forced where not due (draw not reproduced)
        self.untaken: list[dict[str, Any]] = []  # their records (the first UNTAKEN_KEPT)
        self.repaired_fields = 0
        self.truth_lagged_rows = 0
        self.redraw_errors = 0  # rejection_sample redraws that raised (guard_redraw)
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
        if not INSTALL.installed() or self.generation != INSTALL.generation:
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
        self.generation = INSTALL.generation

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
              req_id: str | None = None, sampling_params=None) -> None:
        b = -1 if budget_value is None or int(budget_value) < 0 \
            else min(int(budget_value), _INT32_MAX)
        cnt = reasoning_count(history, self.markers) if b >= 0 else -1
        tail = [int(t) for t in list(history)[-self.TAIL:]]
        tail = [-1] * (self.TAIL - len(tail)) + tail
        self._staged.append([int(slot), b, cnt, *tail])
        self.h_budget[slot], self.h_count[slot] = b, cnt
        self.h_tail[slot] = tail
        self.h_len[slot] = len(history)
        self.sampling.stage(slot, sampling_params)
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
        """Before ``ThinkingBudgetState.apply`` biases ``logits``: ``takeback.capture``."""
        if logits.dim() == 2 and self.end_ids:
            self._end_cols = takeback.capture(self._captured, self._end_cols, logits)

    # -- steps 2-4: enforcement ---------------------------------------------------------------
    def begin_step(self, input_batch) -> None:
        """Before vLLM's ``sample``: this step's batch; nothing captured yet."""
        self._captured, self._batch, self._rows, self._redraws = [], input_batch, None, []

    def step_rows(self, input_batch, num_rows: int) -> "StepRows":
        """This step's batch rows against the host truth, built once per step (after absorbing
        every landed echo): slots, budgets and the truth rows (``T_*`` columns, no mode)."""
        if self._rows is not None and self._rows[0] == num_rows:
            return self._rows[1]
        self.catch_up()
        req_ids = tuple(input_batch.req_ids)
        slots = np.full(num_rows, -1, dtype=np.int32)
        get, m = self.slot_of.get, min(num_rows, len(req_ids))
        slots[:m] = [get(r, -1) for r in req_ids[:m]]
        sc = np.maximum(slots, 0)
        budgets = np.where(slots >= 0, self.h_budget[sc], -1)
        truth = np.empty((num_rows, T_TAIL + self.TAIL), dtype=np.int32)
        truth[:, T_SLOT] = slots
        truth[:, T_BUDGET] = budgets
        truth[:, T_COUNT] = self.h_count[sc]
        lag = self.lagged[sc] & (budgets >= 0)
        truth[:, T_CURRENT] = ~lag
        truth[:, T_TAIL:T_TAIL + self.TAIL] = self.h_tail[sc]
        rows = StepRows(slots, sc, budgets, truth, lag)
        self._rows = (num_rows, rows)
        return rows

    def enforce(self, sampler_output, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                input_batch) -> None:
        """Fix this step's sampled tokens in place (no host sync)."""
        self._last_fixed = self._no_fix
        sampled = sampler_output.sampled_token_ids  # [num_rows, k+1]
        num_rows = int(sampled.shape[0])
        caps, self._captured = self._captured, []
        redraws, self._redraws = self._redraws, []
        self._batch = None
        if num_rows == 0 or not tuple(input_batch.req_ids):
            self.catch_up()
            return
        rows = self.step_rows(input_batch, num_rows)
        self._rows = None
        slots, sc, budgets = rows.slots, rows.sc, rows.budgets
        if not caps and not (budgets >= 0).any():
            return
        redraw = redraws[0] if len(redraws) == 1 else None
        mode = takeback.modes(self.sampling, slots, sc,
                              getattr(input_batch, "cu_num_logits_np", None),
                              int(getattr(input_batch, "num_draft_tokens", 0) or 0) > 0,
                              self.sampler_ok, redraw=redraw is not None) \
            if caps else np.zeros(num_rows, dtype=np.int32)
        tb, untaken = takeback.build(caps, input_batch, num_rows, mode, self.sampling, sc,
                                     self.use_fp64, redraw)
        self.untaken_steps += int(untaken)
        if tb is None and not (budgets >= 0).any():
            return
        truth = np.concatenate([rows.truth, mode.astype(np.int32)[:, None]], axis=1)  # + mode
        self.truth_lagged_rows += int(rows.lag.sum())
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
        req_ids = tuple(input_batch.req_ids)
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
        echo = p.echo.numpy()  # [num_rows, E_TOKENS + K1]
        kept, fixed, repaired = echo[:, E_KEPT], echo[:, E_FIXED], echo[:, E_REPAIRED]
        self.fixed_tokens += int(fixed.sum())
        self.taken_back_tokens += int(echo[:, E_TAKEN].sum())
        for row in np.nonzero(echo[:, E_UNTAKEN])[0].tolist():  # ends kept: their reasons
            self.untaken_rows += 1
            if len(self.untaken) < UNTAKEN_KEPT:
                self.untaken.append({
                    "guard_step": p.seq, "row": row,
                    "req_id": p.req_ids[row] if row < len(p.req_ids) else None,
                    "reason": takeback.reason_text(echo[row, E_UNTAKEN])})
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
            cnt, tail = advance(int(self.h_count[slot]), self.h_tail[slot].tolist(),
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
        out = {"installed": INSTALL.installed(), "enabled": bool(self.enabled),
               "guarded_steps": self.launches, "fixed_tokens": self.fixed_tokens,
               "taken_back_tokens": self.taken_back_tokens, "untaken_steps": self.untaken_steps,
               "untaken_rows": self.untaken_rows,
               "untaken": list(self.untaken if max_records is None
                               else self.untaken[:max_records]),
               "repaired_fields": self.repaired_fields,
               "repaired_requests": sorted({r["req_id"] for r in recs if r["req_id"]}),
               "repairs": recs if max_records is None else recs[:max_records],
               "repairs_dropped": dropped + (len(recs) - max_records
                                             if max_records is not None and
                                             len(recs) > max_records else 0),
               "truth_lagged_rows": self.truth_lagged_rows,
               "redraw_errors": self.redraw_errors}
        return out

    def note_redraw_error(self, e: BaseException) -> None:
        """The rejection sampler's redraw raised: that step keeps its forced ends ("not taken
        back"), counted; the first one is logged on vLLM's logger."""
        self.redraw_errors += 1
        if self.redraw_errors == 1:
            _log().warning("workbook guard: the redraw of the rejection sampler's step failed "
                           "(%s: %s); ends forced in its rows are kept and reported",
                           type(e).__name__, e)

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

