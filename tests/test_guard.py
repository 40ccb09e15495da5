"""The budget guard (``workbook.hooks.guard``) on the real vLLM engine (tiny CPU models, MRV2).

Evidence, in file order (engines are started one at a time and reused: mtp first, then eagle,
ngram, draft_model):

1. kernel: the guard kernel against vLLM's own ``apply_thinking_budget`` kernel as the oracle,
   over random histories / sampled rows / budgets and single- and multi-token markers;
2. patching: ``remove()`` restores vLLM's methods identically, also when stacked with a fault;
3. broken vLLM (mtp, k=4): every in-process fault of the hypothesis catalogue
   (``workbook.hooks.faults.budget``); without the guard checks A/B fail, with it both are exact;
4. healthy vLLM: guard on vs off token-identical with identical step / acceptance counters, and
   ``request.check_b`` exact with the guard on, per spec method, with 0 repairs reported;
5. the guard's own device state corrupted by raw writes written here (all three replicas zeroed,
   two set to 7, one zeroed, every count / tail / budget), every step or once, under MTP with
   drafts accepted and a batch of requests with and without a budget, on healthy vLLM and with
   vLLM losing the budget (H-c): tokens equal healthy vLLM's request by request, every repair
   reported (request, field, values found, the host's truth) — also through ``pipeline.run``
   into ``verdict.json["guard"]`` and ``trace/guard.parquet``;
6. the host's twin of the kernel's walk (``guard.advance``) against the budget rule;
7. no engine: ``GuardState`` over a simulated batch whose echo lands a step late (async
   scheduling): the lagged step falls back to the replicas' majority, the host catches up.

Budgets covered in (4) (union = 0..9 and "no budget"): mtp None,0,1,2,6,9; eagle 0,3,5,7,9;
ngram 1,2,4,6,8; draft_model 0,1,5,7,9. ``request.check_b`` budgets (union = 2..9): mtp 2,6
(6: the boundary on the bonus row); eagle 3,7; ngram 4,8; draft_model 5,9. In (3) every fault
runs budgets 0..9 (A: 0, 1; B: 2..9; 12 tokens, zeroed lm_head) in one batch per guard state.
"""

from __future__ import annotations

import random

import pytest

from workbook.hooks import guard
from workbook.hooks.faults import budget as faults
from workbook.hooks.guard import takeback as guard_takeback
from workbook.run import request
from workbook.run.budget import experiments
from workbook.vllm import env as wb_env
from workbook.vllm import patching
from workbook.core import budget as budget_rule
from workbook.core.budget import Markers
from workbook.core.config import RunConfig
from workbook.core.hypotheses import FAULTS

# Before vLLM is imported anywhere in this process: its environment and, on a CPU, the Triton
# interpreter shim (the kernel tests below run before the first engine starts).
wb_env.prepare_process(RunConfig())

SPEC_METHODS = ("mtp", "eagle", "ngram", "draft_model")
IDENTITY_BUDGETS = {"mtp": [None, 0, 1, 2, 6, 9], "eagle": [0, 3, 5, 7, 9],
                    "ngram": [1, 2, 4, 6, 8], "draft_model": [0, 1, 5, 7, 9]}
CHECK_B_BUDGETS = {"mtp": (2, 6), "eagle": (3, 7), "ngram": (4, 8), "draft_model": (5, 9)}
# Batched check B in (3): 12 tokens cover the checked prefix ([0]*8 + </think> at budget 9).
CHECK_B_MAX_TOKENS = 12
IDENTITY_MAX_TOKENS = 12


# ---- engines: the session's shared in-process engines (tests/conftest.py) ---------------------
# Never shut one down here: in-process engines share the process's distributed environment and
# workspaces, and shutting one down breaks the others the session keeps.

class _Engines:
    def __init__(self, engines):
        self._engines = engines

    def get(self, method: str):
        return self._engines(spec_method=method, num_spec_tokens=4, max_num_seqs=16)


@pytest.fixture(scope="module")
def live_engine(engines):
    return _Engines(engines)


@pytest.fixture(autouse=True)
def _guard_off_after():
    yield
    guard.remove()


# ---- 1. the kernel against vLLM's own forcing kernel -----------------------------------------

MARKERS = {  # (start, natural end, forced end)
    "qwen": ([1], [3], [3]),
    "transition-phrase": ([1], [3], [5, 6, 3]),
    "multi-start-end": ([1, 2], [4, 3], [4, 3]),
    "repeats": ([2, 1, 2], [3, 3], [5, 5, 3]),
}


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter


def _vllm_forced(hist, row, budget, start, nat, end, vocab=16):
    """Per position j of ``row``: the token vLLM's kernel forces given hist + row[:j] (or None)."""
    import torch

    from vllm.v1.worker.gpu.sample.thinking_budget import apply_thinking_budget

    n, i32 = len(row), (lambda x: torch.tensor(x, dtype=torch.int32, device=_device()))
    logits = torch.zeros(n, vocab, device=_device())
    all_tok = i32([hist + [0] * (n + 8)])
    input_ids = i32([hist[-1]] + row[:n - 1])[:n]
    apply_thinking_budget(logits, i32([0]), i32([0] * n), i32([budget]), all_tok,
                          i32([len(hist)]), input_ids, i32(list(range(n))), i32([-1]),
                          i32([-1]), i32([0]), i32(start), i32(nat), i32(end))
    return [int(c[0]) if len(c) else None
            for c in ((logits[j] > 1e8).nonzero().flatten().tolist() for j in range(n))]


def _rule_fixed(hist, row, b, markers):
    """The one budget rule (workbook.core.budget), walked over ``row``: the row as kept."""
    for j, tok in enumerate(row):
        h = hist + row[:j]
        n = budget_rule.reasoning_count(h, markers)
        if n is not None and n >= b:
            forced = budget_rule.forced_token(h, markers)
            if tok != forced:
                return row[:j] + [forced]
    return list(row)


@pytest.mark.parametrize("markers", sorted(MARKERS))
@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_vllm_forcing(markers, seed):
    import torch

    start, nat, end = MARKERS[markers]
    rng = random.Random(seed * 101 + len(markers))
    num_reqs, max_slots = 4, 8
    tail_len = max(len(start) - 1, len(nat) - 1, len(end) - 1, 1)
    slots = rng.sample(range(max_slots), num_reqs)  # batch row -> slot, not the identity
    hists, rows, budgets = [], [], []
    for _ in range(num_reqs):
        h = [rng.choice([0, 1, 2, 3, 4, 5, 6, 8]) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.8:
            h += start + [0] * rng.randint(0, 4)
        hists.append(h)
        rows.append([rng.choice([0, 0, 0, 1, 2, 3, 4, 5, 6]) for _ in range(rng.randint(0, 5))])
        budgets.append(rng.randint(0, 5))
    k1 = 5
    dev = _device()
    sampled = torch.full((num_reqs, k1), 7, dtype=torch.int64)  # [num_reqs, k+1]
    for i, r in enumerate(rows):
        sampled[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
    num_sampled = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    num_rejected = torch.tensor([k1 - len(r) for r in rows], dtype=torch.int32)
    budget = torch.full((max_slots,), -1, dtype=torch.int32)
    count = torch.full((max_slots,), -1, dtype=torch.int32)
    tail = torch.full((max_slots, tail_len), -1, dtype=torch.int32)
    for i, s in enumerate(slots):
        budget[s] = budgets[i]
        count[s] = guard.reasoning_count(hists[i], Markers(start, end, nat))
        tail[s] = torch.tensor(([-1] * tail_len + hists[i])[-tail_len:], dtype=torch.int32)
    fixed_rows = torch.full((num_reqs + 1,), 5, dtype=torch.int32)  # overwritten by the kernel
    fixed_total = torch.tensor([3], dtype=torch.int32)  # accumulates
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    # a padding row (slot -1) must be left alone
    sampled = torch.cat([sampled, torch.full((1, k1), 9, dtype=torch.int64)])
    num_sampled = torch.cat([num_sampled, torch.tensor([3], dtype=torch.int32)])
    num_rejected = torch.cat([num_rejected, torch.tensor([2], dtype=torch.int32)])
    tensors = (sampled, num_sampled, num_rejected, budget, count, tail, fixed_rows, fixed_total)
    sampled, num_sampled, num_rejected, budget, count, tail, fixed_rows, fixed_total = (
        t.to(dev) for t in tensors)
    guard.launch_guard_kernel(sampled, num_sampled, num_rejected, i32(slots + [-1]), budget,
                              count, tail, fixed_rows, fixed_total, i32(start), i32(nat),
                              i32(end))
    sampled, num_sampled, num_rejected, count, tail, fixed_rows, fixed_total = (
        t.cpu() for t in (sampled, num_sampled, num_rejected, count, tail, fixed_rows,
                          fixed_total))
    fixed_want = []
    total_fixed = 0
    for i, s in enumerate(slots):
        forced = _vllm_forced(hists[i], rows[i], budgets[i], start, nat, end)
        want, nfix = list(rows[i]), 0
        for j, f in enumerate(forced):
            if f is not None and rows[i][j] != f:
                want, nfix = rows[i][:j] + [f], 1
                break
        total_fixed += nfix
        fixed_want.append(nfix)
        assert sampled[i, :int(num_sampled[i])].tolist() == want, (hists[i], rows[i], budgets[i])
        assert int(num_rejected[i]) == k1 - len(want)
        assert want == _rule_fixed(hists[i], rows[i], budgets[i], Markers(start, end, nat))
        assert int(count[s]) == guard.reasoning_count(hists[i] + want, Markers(start, end, nat))
        assert tail[s].tolist() == ([-1] * tail_len + hists[i] + want)[-tail_len:]
    assert sampled[-1].tolist() == [9] * k1 and int(num_sampled[-1]) == 3
    assert int(num_rejected[-1]) == 2
    assert fixed_rows.tolist() == fixed_want + [0]  # the padding row reports 0 too
    assert fixed_total.tolist() == [3 + total_fixed]


def _rule_taken_back(hist, row, b, markers, forced, unforced_argmax, greedy):
    """The row as kept by the one budget rule (``budget.row_truth``) in both directions: the
    due end forced where the budget binds; where it does not, an end the forcing put at
    position j (``forced[j]``) replaced, in a greedy row, by ``unforced_argmax[j]``."""
    for j, tok in enumerate(row):
        truth = budget_rule.row_truth(hist + row[:j], [], 0, b, markers)
        if truth.due:
            if tok != truth.token:
                return row[:j] + [truth.token], 1, 0
        elif greedy and forced[j] and unforced_argmax[j] != tok:
            return row[:j] + [unforced_argmax[j]], 1, 1
    return list(row), 0, 0


@pytest.mark.parametrize("markers", sorted(MARKERS))
@pytest.mark.parametrize("seed", range(3))
def test_kernel_takes_back_an_end_forced_where_not_due(markers, seed):
    """The other direction, no engine: rows whose logits were forced at an end id where the
    budget does not bind (early, into a request without a budget, after reasoning ended) get
    the argmax of the row without the forcing (greedy rows; ties to the lowest column, across
    vocabulary blocks); due rows, ends the model chose itself (no forcing bias) and sampled
    rows are left as the rule says. Expected values from ``budget.row_truth``."""
    import torch

    from workbook.hooks.guard.kernel import BLOCK_V, TakeBack

    start, nat, end = MARKERS[markers]
    m = Markers(start, end, nat)
    rng = random.Random(seed * 7 + len(markers))
    vocab, k1, num_reqs, max_slots = 2 * BLOCK_V + 37, 4, 6, 8
    tail_len = max(len(start) - 1, len(nat) - 1, len(end) - 1, 1)
    slots = rng.sample(range(max_slots), num_reqs)
    gen = torch.Generator().manual_seed(seed)
    cu, logits, pre_all, rows, hists, budgets, greedy, want = [0], [], [], [], [], [], [], []
    forced_any = taken_any = 0
    for i in range(num_reqs):
        h = [rng.choice([0, 2, 4, 8]) for _ in range(rng.randint(1, 4))] + start + \
            [0] * rng.randint(0, 3)
        if i % 3 == 2:  # reasoning ended before this step
            h += nat + [0] * rng.randint(0, 2)
        b = None if i % 3 == 1 else rng.randint(len(h), len(h) + 6) if i % 3 == 0 else \
            rng.randint(0, 3)
        g = i != 5
        n = rng.randint(1, k1)
        lg = torch.randn((n, vocab), generator=gen)
        best = [int(x) for x in lg.argmax(-1)]
        hit = rng.randrange(0, 3)  # the unforced best column: block 0, 1 or 2
        for j in range(n):
            col = hit * BLOCK_V + rng.randrange(0, 30)
            lg[j, col] = lg[j].max() + 1.0
            if rng.random() < 0.5:  # a tie: the lower column wins
                lg[j, col + 1] = lg[j, col]
            best[j] = col
        pre = lg[:, list(end)].clone()
        row, forced = [], []
        for j in range(n):
            if rng.random() < 0.6:  # vLLM forced an end here, due or not
                e = rng.choice(end)
                lg[j, e] = 1e9
                row.append(e)
                forced.append(True)
            elif rng.random() < 0.2:  # the model's own end (no forcing bias)
                e = rng.choice(end)
                lg[j, e] = lg[j].max() + 2.0
                row.append(e)
                forced.append(False)
            else:
                row.append(best[j])
                forced.append(False)
        w = _rule_taken_back(h, row, b, m, forced, best, g)
        forced_any += any(forced)
        taken_any += w[2]
        cu.append(cu[-1] + n)
        logits.append(lg)
        pre_all.append(pre)
        rows.append(row)
        hists.append(h)
        budgets.append(b)
        greedy.append(int(g))
        want.append(w)
    sampled = torch.full((num_reqs, k1), 7, dtype=torch.int64)
    for i, r in enumerate(rows):
        sampled[i, :len(r)] = torch.tensor(r)
    num_sampled = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    num_rejected = torch.tensor([k1 - len(r) for r in rows], dtype=torch.int32)
    budget = torch.full((max_slots,), -1, dtype=torch.int32)
    count = torch.full((max_slots,), -1, dtype=torch.int32)
    tail = torch.full((max_slots, tail_len), -1, dtype=torch.int32)
    for i, s in enumerate(slots):
        if budgets[i] is not None:
            budget[s] = budgets[i]
            count[s] = guard.reasoning_count(hists[i], m)
            tail[s] = torch.tensor(([-1] * tail_len + hists[i])[-tail_len:], dtype=torch.int32)
    fixed_rows = torch.zeros(num_reqs, dtype=torch.int32)
    fixed_total = torch.zeros(1, dtype=torch.int32)
    dev = _device()
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    tb = TakeBack(torch.cat(logits).to(dev), torch.cat(pre_all).to(dev, torch.float32), i32(cu))
    ts = [t.to(dev) for t in (sampled, num_sampled, num_rejected, budget, count, tail,
                              fixed_rows, fixed_total)]
    out = guard.launch_guard_kernel(ts[0], ts[1], ts[2], i32(slots), *ts[3:], i32(start),
                                    i32(nat), i32(end), take_back=tb, greedy=i32(greedy))
    sampled, num_sampled, num_rejected, budget, count, tail, fixed_rows, fixed_total = (
        t.cpu() for t in ts)
    echo = out["echo"].cpu()
    for i, s in enumerate(slots):
        kept, nfix, ntaken = want[i]
        got = sampled[i, :int(num_sampled[i])].tolist()
        assert got == kept, (i, hists[i], rows[i], budgets[i], greedy[i])
        assert int(num_rejected[i]) == k1 - len(kept)
        assert int(echo[i, guard.E_FIXED]) == nfix and int(echo[i, guard.E_TAKEN]) == ntaken
        if budgets[i] is None:  # a request without a budget keeps its device state
            assert int(count[s]) == -1
        else:
            assert int(count[s]) == guard.reasoning_count(hists[i] + kept, m)
    assert int(out["repairs"].cpu()) == 0
    assert fixed_total.tolist() == [sum(w[1] for w in want)]
    assert forced_any > 0 and taken_any > 0, (forced_any, taken_any)


@pytest.mark.parametrize("markers", ["qwen", "transition-phrase"])
def test_kernel_takes_back_a_sampled_row_with_vllms_own_draw(markers):
    """Sampled rows, no engine: vLLM's own sampler functions are the oracle. Each row is
    processed as ``Sampler`` does (``ThinkingBudgetState``'s +1e9 at an end id where it is not
    due, then vLLM's ``apply_temperature`` in place, then its seeded ``gumbel_sample``, which
    draws the forced end); the guard must replace it by what ``gumbel_sample`` draws from the
    same row without the forcing (same seed, position and temperature — temperatures 0.7, 1.0
    and 1.6, seeds across the int64 range, the winner in any vocabulary block). Rows it may not
    reproduce keep the end and say why (no seed; top-k / top-p / min-p; the rejection sampler);
    a due end, and an end the row drew itself, stay."""
    import torch

    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample

    from workbook.hooks.guard import takeback as guard_takeback
    from workbook.hooks.guard.kernel import BLOCK_V

    start, nat, end = MARKERS[markers]
    m = Markers(start, end, nat)
    dev = _device()
    rng = random.Random(len(markers))
    gen = torch.Generator().manual_seed(3)
    vocab, n = 2 * BLOCK_V + 37, 10
    temps = [0.7, 1.0, 1.6, 0.7, 1.0, 1.6, 0.9, 0.9, 1.2, 1.2]
    seeds = [rng.randrange(-2**63, 2**63) for _ in range(n)]
    modes = [guard.M_SAMPLED] * 6 + [guard.R_NO_SEED, guard.R_MASKED, guard.R_DRAFTS,
                                     guard.M_SAMPLED]
    hist = [4, 4] + start + [0, 0]
    budgets = [None, None, 9, None, 9, None, None, 9, None, 0]  # row 9: due (count 2 >= 0)
    own_end = {5}  # the row drew the end itself (its end column high, no forcing)
    raw = torch.randn((n, vocab), generator=gen) * 2
    for i in range(0, n, 2):  # even rows: a clear winner in block 0, 1 or 2; odd: the noise's
        raw[i, ((i // 2) % 3) * BLOCK_V + rng.randrange(0, 30)] += 30.0
    raw[5, end[0]] = 80.0
    pre = raw[:, list(end)].clone()
    forced = raw.clone()
    for i in range(n):
        if i not in own_end:
            forced[i, end[0]] = 1e9  # the budget's forcing, due (row 9) or not
    slots = list(range(n))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    idx, temp_t = i32(slots), torch.tensor(temps, dtype=torch.float32, device=dev)
    seed_t = torch.tensor(seeds, dtype=torch.int64, device=dev)
    pos = torch.tensor([len(hist) + i for i in range(n)], dtype=torch.int64, device=dev)
    processed = forced.to(dev)
    apply_temperature(processed, idx, temp_t)  # in place, as Sampler does after apply
    try:
        gumbel_sample(processed[:1], idx[:1], temp_t, seed_t, pos[:1], apply_temperature=False,
                      is_drafting=False)
    except Exception as e:  # noqa: BLE001  (the oracle itself cannot run here)
        import vllm

        pytest.skip(f"vLLM {vllm.__version__}'s own gumbel_sample does not run on {dev} "
                    f"here ({type(e).__name__}), so there is no oracle to compare with")
    drawn = gumbel_sample(processed, idx, temp_t, seed_t, pos, apply_temperature=False,
                          is_drafting=False).cpu().tolist()
    unforced = raw.clone().to(dev)
    apply_temperature(unforced, idx, temp_t)
    want_draw = gumbel_sample(unforced, idx, temp_t, seed_t, pos, apply_temperature=False,
                              is_drafting=False).cpu().tolist()
    assert drawn[:5] == [end[0]] * 5 and drawn[5] == end[0]
    assert len({w // BLOCK_V for w in want_draw}) == 3  # winners in every block
    assert any(w != int(a) for w, a in zip(want_draw, unforced.argmax(-1).cpu()))  # not argmax
    budget = torch.tensor([-1 if b is None else b for b in budgets], dtype=torch.int32)
    count = torch.tensor([-1 if b is None else guard.reasoning_count(hist, m) for b in budgets],
                         dtype=torch.int32)
    tail_len = max(len(start) - 1, len(nat) - 1, len(end) - 1, 1)
    tail = torch.tensor([([-1] * tail_len + hist)[-tail_len:]] * n, dtype=torch.int32)
    sampled = torch.tensor(drawn, dtype=torch.int64)[:, None]
    ns, nr = torch.ones(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)
    ts = [t.to(dev) for t in (sampled, ns, nr, budget, count, tail,
                              torch.zeros(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))]
    tb = guard.TakeBack(processed, pre.to(dev), i32(list(range(n + 1))), temp=temp_t,
                        seed=seed_t, pos=pos)
    out = guard.launch_guard_kernel(ts[0], ts[1], ts[2], idx, *ts[3:], i32(start), i32(nat),
                                    i32(end), take_back=tb, mode=i32(modes))
    got, echo = ts[0].cpu()[:, 0].tolist(), out["echo"].cpu()
    for i in range(n):
        if modes[i] == guard.M_SAMPLED and i not in own_end and i != 9:
            assert got[i] == want_draw[i] != end[0], (i, got[i], want_draw[i])
            assert int(echo[i, guard.E_TAKEN]) == 1 and int(echo[i, guard.E_UNTAKEN]) == 0
        else:  # kept: its own end, a due end, or a draw the guard does not reproduce
            assert got[i] == drawn[i] == end[0], i
            assert int(echo[i, guard.E_TAKEN]) == 0
            why = int(echo[i, guard.E_UNTAKEN])
            assert why == (modes[i] if i in (6, 7, 8) else 0), (i, why)
            if why:
                assert guard_takeback.reason_text(why).startswith("not taken back: ")


@pytest.mark.parametrize("rows,want", [
    # (mode, budget, count, current) per batch row -> whether the redraw must run
    ([(guard.M_REDRAW, 4, 1, 1)], True),            # budget not due: a forced end is a fault's
    ([(guard.M_REDRAW, 4, 4, 1)], False),           # due from its first row: the budget's own
    ([(guard.M_REDRAW, -1, -1, 1)], True),          # no budget: any forced end is a fault's
    ([(guard.M_REDRAW, 4, 9, 0)], True),            # the host's count lags: not trusted
    ([(guard.M_GREEDY, 4, 1, 1), (guard.M_REDRAW, 2, 2, 1)], False),  # greedy: no redraw
    ([(guard.M_REDRAW_ROW, 4, 1, 1), (guard.M_REDRAW, 2, 2, 1)], True),
    ([(guard.R_NO_SEED, 4, 1, 1)], False)])
def test_the_redraw_runs_only_where_a_forced_end_can_be_taken_back(rows, want):
    """The rejection sampler's redraw (a second rejection sample) only in a step with a
    redrawn row whose budget is not due at its first row by the host truth."""
    import numpy as np

    from workbook.hooks.guard import redraw as guard_redraw
    from workbook.hooks.guard.kernel import T_TAIL

    mode = np.array([r[0] for r in rows], dtype=np.int32)
    truth = np.zeros((len(rows), T_TAIL + 1), dtype=np.int32)
    for i, (_m, b, c, cur) in enumerate(rows):
        truth[i, 1:4] = (b, c, cur)
    assert guard_redraw.needed(mode, truth) is want


def test_kernel_takes_back_a_rejection_sampled_end_with_vllms_redraw():
    """Speculative decoding, no engine: vLLM's own ``rejection_sample`` is the oracle. Five
    requests of k = 3 drafts, sampled (temperatures 0.7 / 1.0 / 1.6, int64 seeds). vLLM's run:
    its processed rows with +1e9 at the end id where a fault forced it (into requests without a
    budget, into not-due rows, after a due end) and where the budget is due; the oracle: the
    same call on the rows with only the due forcing. ``guard_redraw.unforced`` must give exactly
    the oracle's rows, and the guard kernel, given vLLM's tokens and the redraw, exactly the
    oracle's tokens and ``num_sampled`` for every request (an accepted forced draft, a resampled
    forced end, a forced bonus row, a due end kept, an unforced request untouched). A redraw
    whose tokens before the forced row differ from the step's is not used: the end is kept,
    "not taken back"."""
    import torch

    from workbook.hooks.guard import redraw as guard_redraw
    from workbook.hooks.guard.kernel import T_TAIL

    try:
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample
    except ImportError as e:
        pytest.skip(f"this vLLM has no MRV2 rejection_sample ({e})")
    start, nat, end = MARKERS["qwen"]
    m = Markers(start, end, nat)
    E = end[0]
    dev = _device()
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    vocab, k, nreq = 300, 3, 5
    k1 = k + 1
    hist = [4, 4] + start + [7]  # reasoning count 1
    budgets = [None, None, 9, 2, None]
    temps = [0.7, 1.0, 1.6, 0.7, 1.0]
    seeds = [rng.randrange(-2**63, 2**63) for _ in range(nreq)]
    drafts = [[E, 20, 21], [30, 31, 32], [40, 41, 42], [50, E, 52], [60, 61, 62]]
    fault_rows = {0: [1], 1: [0, 1, 2, 3], 2: [2, 3], 3: [2, 3], 4: []}
    due_rows = {3: [1]}  # count 1 + row 0's draft -> 2 >= budget 2 at row 1
    raw = torch.randn((nreq * k1, vocab), generator=gen)
    for r in range(nreq):
        for j in range(k):  # drafts likely kept (except request 1's): their column high
            if r != 1:
                raw[r * k1 + j, drafts[r][j]] += 12.0
    forced, oracle = raw.clone(), raw.clone()
    for r in range(nreq):
        for j in fault_rows[r] + due_rows.get(r, []):
            forced[r * k1 + j, E] = 1e9
        for j in due_rows.get(r, []):
            oracle[r * k1 + j, E] = 1e9
    pre = raw[:, [E]].clone()
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    slots = list(range(nreq))
    cu = i32([r * k1 for r in range(nreq + 1)])
    draft_sampled = i32(sum(([hist[-1]] + d for d in drafts), []))
    pos = torch.tensor([len(hist) + j for _ in range(nreq) for j in range(k1)],
                       dtype=torch.int64, device=dev)
    exp_idx = i32([r for r in range(nreq) for _ in range(k1)])
    exp_pos = i32([j for _ in range(nreq) for j in range(k1)])
    temp_t = torch.tensor(temps, dtype=torch.float32, device=dev)
    seed_t = torch.tensor(seeds, dtype=torch.int64, device=dev)

    def processed(x):
        return (x / temp_t.cpu()[exp_idx.cpu().long(), None]).to(dev)

    def rs(x):
        return rejection_sample(x, None, draft_sampled, cu, pos, i32(slots), exp_idx, exp_pos,
                                temp_t, seed_t, k)

    try:
        got_s, got_n = rs(processed(forced))
    except Exception as e:  # noqa: BLE001  (the oracle itself cannot run here)
        pytest.skip(f"vLLM's own rejection_sample does not run on {dev} here "
                    f"({type(e).__name__}: {e})")
    want_s, want_n = rs(processed(oracle))
    want = [want_s[r, :int(want_n[r])].tolist() for r in range(nreq)]
    before = [got_s[r, :int(got_n[r])].tolist() for r in range(nreq)]
    assert any(E in b for b in before)  # vLLM drew forced ends
    tail_len = 1
    truth = torch.tensor([[r, -1 if budgets[r] is None else budgets[r],
                           -1 if budgets[r] is None else guard.reasoning_count(hist, m), 1,
                           hist[-1], guard.M_REDRAW] for r in range(nreq)], dtype=torch.int32,
                         device=dev)
    assert truth.shape[1] == T_TAIL + tail_len + 1
    alt = processed(forced)
    saved = guard_redraw.unforced(alt, pre.to(dev), cu, draft_sampled, truth, temp_t, m,
                                  tail_len)  # in place: no copy of the step's logits
    assert torch.equal(alt.cpu(), processed(oracle).cpu())  # exactly the rows without forcing
    assert tuple(saved.shape) == (nreq * k1, len(end))  # the end columns only
    red_s, red_n = rs(alt)
    guard_redraw.forced_again(alt, saved, m)  # what vLLM's later readers see: its own rows
    assert torch.equal(alt.cpu(), processed(forced).cpu())

    def run(redraw_s, mode=guard.M_REDRAW):
        budget = torch.tensor([-1 if b is None else b for b in budgets], dtype=torch.int32)
        count = truth[:, 2].cpu().clone()
        tail = torch.tensor([[hist[-1]]] * nreq, dtype=torch.int32)
        sampled = got_s.clone()
        ns, nr = got_n.to(torch.int32).clone(), torch.zeros(nreq, dtype=torch.int32, device=dev)
        ts = [t.to(dev) for t in (budget, count, tail, torch.zeros(nreq, dtype=torch.int32),
                                  torch.zeros(1, dtype=torch.int32))]
        tb = guard.TakeBack(processed(forced), pre.to(dev), cu, temp=temp_t, redraw=redraw_s,
                            redraw_n=red_n.to(torch.int32))
        out = guard.launch_guard_kernel(sampled, ns, nr, i32(slots), *ts, i32(start), i32(nat),
                                        i32(end), take_back=tb,
                                        mode=i32([mode] * nreq))
        return [sampled[r, :int(ns[r])].tolist() for r in range(nreq)], out["echo"].cpu(), nr

    got, echo, nr = run(red_s)
    print("vLLM:", before, "\nguard:", got, "\nwithout the forcing:", want)
    assert got == want, (before, got, want)
    assert got != before
    for r in range(nreq):
        taken = int(echo[r, guard.E_TAKEN])
        assert taken == int(before[r] != want[r]), (r, before[r], want[r])
        assert int(echo[r, guard.E_UNTAKEN]) == 0
        assert int(nr[r]) == len(before[r]) - len(want[r])  # the rest of the redraw's step
    # a request asking for logprobs takes the redrawn row alone (vLLM's logprobs are for its
    # own tokens): the step ends there, as after any replaced token
    got_row, echo_row, _ = run(red_s, guard.M_REDRAW_ROW)
    for r in range(nreq):
        j = next((i for i, (a, b) in enumerate(zip(before[r], want[r])) if a != b), None)
        assert got_row[r] == (before[r] if j is None else want[r][:j + 1]), (r, got_row[r])
    # a redraw that is not this step's draw before the forced row is not used
    bad = red_s.clone()
    bad[0, 0] = (int(bad[0, 0]) + 1) % vocab
    got_bad, echo_bad, _ = run(bad)
    assert got_bad[0] == before[0] and int(echo_bad[0, guard.E_UNTAKEN]) == guard.R_DRAFTS


@pytest.mark.parametrize("params,others,cu,drafts,sampler_ok,redraw,want", [
    (dict(temperature=0.0), {}, [0, 1], False, True, False, "M_GREEDY"),
    (dict(temperature=0.0), {}, [0, 3], True, False, False, "M_GREEDY"),  # greedy: its argmax
    (dict(temperature=0.0), {}, [0, 3], True, True, True, "M_GREEDY"),
    (dict(temperature=0.8, seed=5), {}, [0, 1], False, True, False, "M_SAMPLED"),
    (dict(temperature=0.8), {}, [0, 1], False, True, False, "R_NO_SEED"),
    (dict(temperature=0.8, seed=5, min_p=0.1), {}, [0, 1], False, True, False, "R_MASKED"),
    (dict(temperature=0.8, seed=5), dict(top_k=5), [0, 1], False, True, False, "R_MASKED"),
    (dict(temperature=0.8, seed=5), dict(top_p=0.9), [0, 1], False, True, False, "R_MASKED"),
    (dict(temperature=0.8, seed=5), {}, [0, 1], True, True, False, "R_DRAFTS"),  # a neighbour
    (dict(temperature=0.8, seed=5), {}, [0, 3], True, True, False, "R_DRAFTS"),  # no redraw
    (dict(temperature=0.8, seed=5), {}, [0, 1], False, False, False, "R_SAMPLER"),
    # the rejection sampler drew the step and its draw without the forcing is at hand
    (dict(temperature=0.8, seed=5), {}, [0, 3], True, True, True, "M_REDRAW"),
    (dict(temperature=0.8, seed=5, logprobs=2), {}, [0, 3], True, True, True, "M_REDRAW_ROW"),
    (dict(temperature=0.8, seed=5), {}, [0, 1], True, False, True, "M_REDRAW"),
    (dict(temperature=0.8), {}, [0, 3], True, True, True, "R_NO_SEED"),
    (dict(temperature=0.8, seed=5), dict(top_p=0.9), [0, 3], True, True, True, "R_MASKED"),
])
def test_take_back_mode_per_row(params, others, cu, drafts, sampler_ok, redraw, want):
    """How a row's forced end is taken back, from its ``SamplingParams`` and the step: greedy
    always; sampled only with a seed, no top-k / top-p anywhere in the batch (vLLM applies them
    to every row) nor min-p on the row — drawn by vLLM's plain sampler (no drafts in the step)
    or by its rejection sampler with that draw redone without the forcing (``redraw``)."""
    import numpy as np
    from vllm import SamplingParams

    from workbook.hooks.guard import takeback as guard_takeback

    ss = guard_takeback.SlotSampling(4)
    ss.stage(2, SamplingParams(**params))
    ss.stage(0, SamplingParams(temperature=0.5, seed=1, **others))  # the neighbour row
    slots = np.array([2, 0], dtype=np.int32)
    cu2 = np.array(cu + [cu[-1] + 1])
    got = guard_takeback.modes(ss, slots, slots.copy(), cu2, drafts, sampler_ok, redraw=redraw)
    assert int(got[0]) == getattr(guard, want), (got, want)
    if guard.R_NO_SEED <= got[0] <= guard.R_LAGGED:
        assert guard_takeback.reason_text(got[0]).startswith("not taken back: ")
        assert "reason code" not in guard_takeback.reason_text(got[0])


@pytest.mark.parametrize("history,expected", [
    ([5, 1, 0, 0], 2),  # two reasoning tokens after <think>
    ([5, 1], 0),
    ([5, 1, 0, 3, 0], -1),  # natural end after the start
    ([5, 0, 0], -1),  # no start
    ([1, 0, 3, 1, 0, 0, 0], 3),  # a second start re-opens reasoning
])
def test_reasoning_count_host(history, expected):
    assert guard.reasoning_count(history, Markers([1], [3], [3])) == expected


# ---- 2. removal restores vLLM exactly ---------------------------------------------------------

def test_remove_restores_original_methods():
    import importlib

    from workbook.vllm import hookpoints

    runner_cls = hookpoints.resolve().runner
    attrs = ("add_requests", "sample")
    before = {a: runner_cls.__dict__[a] for a in attrs}
    assert all(patching.original(runner_cls, a) is before[a] for a in attrs)
    ps = guard.install()
    assert ps.name == "guard" and guard.installed()
    for a in attrs:
        assert runner_cls.__dict__[a] is not before[a]
        assert patching.original(runner_cls, a) is before[a]
    assert patching.active()[f"{runner_cls.__qualname__}.sample"] == ["guard"]
    rmod = importlib.import_module(hookpoints.resolve().rejection.__module__)
    rs_before = patching.original(rmod, "rejection_sample")
    assert rmod.__dict__["rejection_sample"] is not rs_before  # the redraw's wrapper
    guard.remove()
    assert all(runner_cls.__dict__[a] is before[a] for a in attrs)
    assert rmod.__dict__["rejection_sample"] is rs_before
    # stacked under a fault on the same method: removing the guard keeps the fault, then both go
    fault = patching.PatchSet("test-fault", layer="fault")
    fault.wrap(runner_cls, "sample", lambda orig: (lambda self, *a, **k: orig(self, *a, **k)))
    with fault:
        guard.install()
        assert patching.active()[f"{runner_cls.__qualname__}.sample"] == ["test-fault", "guard"]
        guard.remove()
        assert patching.active()[f"{runner_cls.__qualname__}.sample"] == ["test-fault"]
        assert runner_cls.__dict__["add_requests"] is before["add_requests"]
    assert all(runner_cls.__dict__[a] is before[a] for a in attrs)
    with guard.enabled():
        assert runner_cls.__dict__["sample"] is not before["sample"]
    assert runner_cls.__dict__["sample"] is before["sample"] and not guard.installed()


# ---- 3. broken vLLM: the guard restores checks A and B -----------------------------------------

# Every in-process fault of the hypothesis catalogue (workbook.hooks.faults.budget), one batch per guard
# state: checks A and B together under the zeroed lm_head (budgets 0, 1 → </think> first, as in
# A; 2..9 as in B). H-h is a V1 run: there is no MRV2 for the guard to hook. The faults of the
# other side (the end forced where it is not due: early, unbudgeted, twice) run the mixed batch
# of (5) instead, whose requests without a budget and tokens after the end they can reach.
CATALOGUE_FAULTS = tuple(f for f in faults.FAULT_NAMES if f != "H-h")


@pytest.mark.parametrize("fault", CATALOGUE_FAULTS)
def test_guard_fixes_every_hypothesis_fault(live_engine, fault):
    eng = live_engine.get("mtp")
    assert eng.effective["runner_is_v2"] and eng.effective["spec_method"] == "mtp"
    if FAULTS[fault].side != "missing":
        return _guard_takes_back_the_forced_end(eng, fault)
    budgets = tuple(range(10))
    handle = faults.inject(fault, engine=eng)
    try:
        with experiments.StepCounter() as off:
            ab_off = request.check_b(eng, budgets, max_tokens=CHECK_B_MAX_TOKENS)
        with guard.enabled(), experiments.StepCounter() as on:
            ab_on = request.check_b(eng, budgets, max_tokens=CHECK_B_MAX_TOKENS)
    finally:
        handle.remove()
    assert not request.check_ok("B", ab_off), fault  # the fault is real: vLLM alone violates
    assert off.guard_fixed == 0
    assert request.check_ok("B", ab_on), [o.token_ids for o in ab_on]  # with the guard: exact
    assert [o.actual_end_index for o in ab_on] == [o.expected_end_index for o in ab_on]
    end = eng.effective["reasoning_end_token_ids"]
    assert [o.token_ids[:len(end)] for o in ab_on[:2]] == [end, end]  # A: </think> first
    assert on.guard_fixed > 0


def _guard_takes_back_the_forced_end(eng, fault):
    """The mixed batch (budgets and none) under a fault that forces the end where it is not
    due: vLLM alone emits an end whose first forcing the rule calls the fault's kind; with the
    guard every request's tokens are healthy vLLM's (greedy: the argmax of the row without the
    forcing), and the report counts the tokens it took back — every token it replaced."""
    ref = _healthy_reference(eng)
    side = FAULTS[fault].side
    end = eng.effective["reasoning_end_token_ids"]
    markers = Markers.of(eng.effective)
    prompt = request.prompt_ids(eng.tokenizer, eng.cfg)
    handle = faults.inject(fault, engine=eng)
    try:
        with request.zeroed_lm_head(eng), experiments.StepCounter() as off:
            outs_off = request.run_budgets(eng, MIXED_BUDGETS, max_tokens=MIXED_MAX_TOKENS)
        with guard.enabled(), request.zeroed_lm_head(eng), experiments.StepCounter() as on:
            outs_on = request.run_budgets(eng, MIXED_BUDGETS, max_tokens=MIXED_MAX_TOKENS)
            rep = guard.report(eng.runner)
    finally:
        handle.remove()
    # the fault is real: vLLM alone forced the end where the rule says it was not due, of the
    # fault's kind, in at least one request (the first token that differs from healthy vLLM's)
    kinds = set()
    for o, r, b in zip(outs_off, ref, MIXED_BUDGETS):
        i = next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids)) if x != y), None)
        if i is not None:
            assert o.token_ids[i] == end[0], (b, o.token_ids, r.token_ids)
            j = budget_rule.judge(prompt, o.token_ids, b, markers, forced=[i])
            kinds.add(j.kind)
    assert side in kinds, (fault, kinds, [o.token_ids for o in outs_off])
    assert off.guard_fixed == 0
    # with the guard: exactly healthy vLLM's tokens, request by request
    assert [o.token_ids for o in outs_on] == [o.token_ids for o in ref], fault
    assert [o.finish_reason for o in outs_on] == [o.finish_reason for o in ref]
    assert rep["taken_back_tokens"] > 0 and rep["untaken_steps"] == 0
    assert rep["fixed_tokens"] == rep["taken_back_tokens"] == on.guard_fixed  # all taken back
    assert rep["repaired_fields"] == 0


SAMPLED = dict(temperature=0.8, seed=1234)  # a sampled request with a seed (vLLM: reproducible)
# H-d-twice under MTP is left out: its forced decode rows are the ones H-d-unbudgeted forces
# there (the rejection sampler's draw either way), and the suite's 45 minutes are spent elsewhere
SAMPLED_FAULTS = {"none": ("H-d-unbudgeted", "H-d-twice"),
                  "mtp": ("H-d-unbudgeted", "H-d-early")}
SAMPLED_MAX_TOKENS = 8
# With MTP the target is uniform over three tokens and the zeroed drafter drafts token 0 (its
# argmax): each draft is kept with probability 1/3, so draft rows — the rows H-d-early forces —
# are reached at T > 0 (a target uniform over the vocabulary never keeps a draft)
REACH_DRAFTS = dict(allowed_token_ids=[0, 11, 12])


def test_guard_takes_back_sampled_ends_with_vllms_draw(engines):
    """Temperature > 0 with a request seed, the mixed batch, zeroed lm_head. Without drafts
    (spec_method none: vLLM's ``Sampler``) H-d-unbudgeted and H-d-twice force ends where none
    is due; with MTP (vLLM's rejection sampler draws the decode steps) those two and H-d-early,
    which forces draft rows only. With the guard every request's tokens are healthy vLLM's:
    each forced end taken back with vLLM's own seeded draw — under MTP its rejection sampler's
    draw of the step without the forcing (``guard_redraw``), the rest of that step with it —
    and nothing is left "not taken back". On healthy vLLM the guard takes back nothing."""
    for method, fault_names in SAMPLED_FAULTS.items():
        eng = engines(spec_method=method, num_spec_tokens=4, max_num_seqs=16) \
            if method != "none" else engines(spec_method="none", max_num_seqs=16)
        extra = REACH_DRAFTS if method != "none" else {}

        def run():
            with request.zeroed_lm_head(eng):
                return request.run_budgets(eng, MIXED_BUDGETS, max_tokens=SAMPLED_MAX_TOKENS,
                                           **SAMPLED, **extra)

        ref = run()
        with guard.enabled():
            healthy = run()
            rep = guard.report(eng.runner)
        assert [o.token_ids for o in healthy] == [o.token_ids for o in ref]
        assert rep["guarded_steps"] > 0 and rep["fixed_tokens"] == rep["untaken_rows"] == 0
        for fault in fault_names:
            handle = faults.inject(fault, engine=eng)
            try:
                with experiments.StepCounter() as off_steps:
                    off = run()
                guard.install()
                on = run()
                rep = guard.report(eng.runner)
            finally:
                guard.remove()
                handle.remove()
            seen = [o.token_ids for o in off] != [o.token_ids for o in ref]
            equal = sum(a.token_ids == b.token_ids for a, b in zip(on, ref))
            print(f"{method} {fault} T={SAMPLED['temperature']}: fault changed tokens {seen}; "
                  f"drafts {off_steps.draft_tokens}, rejected {off_steps.totals()['num_rejected']}"
                  f"; with the guard {equal}/{len(ref)} requests equal healthy; taken back "
                  f"{rep['taken_back_tokens']}, not taken back {rep['untaken_rows']}")
            assert seen, fault  # the fault is real: vLLM alone changed the tokens
            assert rep["taken_back_tokens"] == rep["fixed_tokens"] > 0, (fault, rep)  # no guess
            assert equal == len(ref), (fault, [o.token_ids for o in on],
                                       [o.token_ids for o in ref])
            assert [o.finish_reason for o in on] == [o.finish_reason for o in ref]
            assert rep["untaken_rows"] == rep["untaken_steps"] == rep["redraw_errors"] == 0, rep


def test_guard_state_reset_on_reinstall(live_engine):
    eng = live_engine.get("mtp")
    with guard.enabled():
        request.run_reported(eng, budget=3, max_tokens=4)
        st = guard.state(eng.runner)
        assert st is not None and st.enabled and st is eng.runner._workbook_guard
        assert st.start_ids == eng.effective["reasoning_start_token_ids"]
        assert st.end_ids == eng.effective["reasoning_end_token_ids"]
    guard.install()  # a new install: slots staged under the old one are forgotten
    st = guard.state(eng.runner)
    assert not st.has_budget.any() and int((st.budget >= 0).sum()) == 0
    guard.remove()


# ---- 4. healthy vLLM: identical with and without the guard -------------------------------------

@pytest.mark.parametrize("method", SPEC_METHODS)
def test_guard_is_identity_on_healthy_vllm(live_engine, method):
    eng = live_engine.get(method)
    assert eng.effective["runner_is_v2"] and eng.effective["spec_method"] == method
    assert eng.effective["thinking_budget_enabled"]
    budgets = IDENTITY_BUDGETS[method]
    with experiments.StepCounter() as off:
        outs_off = request.run_budgets(eng, budgets, max_tokens=IDENTITY_MAX_TOKENS)
    with guard.enabled():
        with experiments.StepCounter() as on:
            outs_on = request.run_budgets(eng, budgets, max_tokens=IDENTITY_MAX_TOKENS)
        b_on = request.check_b(eng, budgets=CHECK_B_BUDGETS[method], max_tokens=CHECK_B_MAX_TOKENS)
        rep = guard.report(eng.runner)
    assert rep["guarded_steps"] > 0 and rep["fixed_tokens"] == 0
    assert rep["taken_back_tokens"] == 0 and rep["untaken_steps"] == 0  # nothing taken back
    assert rep["repaired_fields"] == 0 and rep["repairs"] == []  # its state was never wrong
    assert [o.token_ids for o in outs_on] == [o.token_ids for o in outs_off]
    assert [o.finish_reason for o in outs_on] == [o.finish_reason for o in outs_off]
    # same steps, same drafts, same acceptance: the guard changed nothing
    tot_on, tot_off = on.totals(), off.totals()
    for key in ("steps", "num_sampled", "num_rejected", "draft_tokens"):
        assert tot_on[key] == tot_off[key], (key, tot_on, tot_off)
    assert on.guard_fixed == 0 and off.guard_fixed == 0
    assert all(o.honored in (True, None) for o in outs_on)
    assert any(o.honored is True for o in outs_on)
    assert off.draft_tokens > 0  # speculation really ran
    assert all(o.extra["check_b_prefix_ok"] for o in b_on), [o.token_ids for o in b_on]
    assert [o.actual_end_index for o in b_on] == [o.expected_end_index for o in b_on]


# ---- 5. the guard's own device state corrupted by a raw device writer (written here) ----------
#
# A writer below the guard (layer "fault", in ``sample`` before vLLM samples, i.e. after the
# forward and before the guard's kernel) overwrites the guard's per-slot replicas through a raw
# alias of their storage (``_version`` unchanged, as #54906's writer did): all three replicas,
# two, one, or one field (count / tail / budget) in all three. Every guarded step, or once. The
# batch mixes requests with and without a budget, under MTP with drafts accepted (zeroed
# lm_head). vLLM itself is healthy or loses the budget (H-c: the guard must force).
# Expected: every request's tokens are exactly healthy vLLM's (= the budget rule; requests
# without a budget untouched), and every repair is reported with its request, field, the values
# found and the host's truth.

MIXED_BUDGETS = (None, 0, 1, 2, 5, 6, 9, None)
MIXED_MAX_TOKENS = 12


def _raw(t):
    """A tensor on ``t``'s storage that PyTorch does not know as ``t`` (no ``_version`` bump)."""
    import torch

    with torch.inference_mode():
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(
            t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _fill(t, value) -> None:
    import torch

    with torch.inference_mode():
        _raw(t).fill_(value)


def _fields(st, k):
    """(budget, count, tail) views of replica ``k``."""
    return guard.replica_views(st.replicas[k], st.max_num_reqs, st.TAIL)


CORRUPTIONS = {  # name -> (write(state, start_id), fields the guard must report repaired)
    "all-replicas-zero": (lambda st, s: [_fill(r, 0) for r in st.replicas],
                          {"budget", "count", "tail[0]"}),
    "two-replicas-7": (lambda st, s: [_fill(r, 7) for r in st.replicas[:2]],
                       {"budget", "count", "tail[0]"}),
    "one-replica-zero": (lambda st, s: _fill(st.replicas[1], 0), {"budget", "count", "tail[0]"}),
    "count-all-1000": (lambda st, s: [_fill(_fields(st, k)[1], 1000) for k in range(3)],
                       {"count"}),
    "tail-all-start": (lambda st, s: [_fill(_fields(st, k)[2], s) for k in range(3)],
                       {"tail[0]"}),
    "budget-all-none": (lambda st, s: [_fill(_fields(st, k)[0], -1) for k in range(3)],
                        {"budget"}),
    "budget-all-zero": (lambda st, s: [_fill(_fields(st, k)[0], 0) for k in range(3)],
                        {"budget"}),
}


class _GuardStateWriter:
    """The raw writer: a ``PatchSet`` on the runner's ``sample`` (layer "fault")."""

    def __init__(self, write, start_id: int, every: bool, at_call: int = 2):
        from workbook.vllm import hookpoints

        self.write, self.start_id, self.every, self.at_call = write, start_id, every, at_call
        self.calls = self.writes = 0
        self.ps = patching.PatchSet("test:guard-state-writer", layer="fault")
        self.ps.wrap(hookpoints.resolve().runner, "sample", self._make)

    def _make(self, orig):
        writer = self

        def sample(runner, *a, **k):
            st = runner.__dict__.get(guard.ATTR)
            if st is not None and st.generation == guard.generation():
                writer.calls += 1
                if writer.every or writer.calls == writer.at_call:
                    writer.write(st, writer.start_id)
                    writer.writes += 1
            return orig(runner, *a, **k)

        return sample

    def __enter__(self):
        self.ps.install()
        return self

    def __exit__(self, *exc):
        self.ps.remove()
        return False


_REFERENCE: dict = {}


def _engine_id(req_id: str, outs) -> str | None:
    """The ``Outcome.request_id`` of an engine-side request id (vLLM suffixes ``-<random>``)."""
    return next((o.request_id for o in outs
                 if req_id == o.request_id or req_id.startswith(o.request_id + "-")), None)


def _healthy_reference(eng):
    """Healthy vLLM, no guard, no writer: the mixed batch's tokens (= the budget rule)."""
    if "mixed" not in _REFERENCE:
        with request.zeroed_lm_head(eng), experiments.StepCounter() as c:
            outs = request.run_budgets(eng, MIXED_BUDGETS, max_tokens=MIXED_MAX_TOKENS)
        assert c.draft_tokens > 0 and c.num_rejected < c.draft_tokens  # drafts accepted
        _REFERENCE["mixed"] = outs
    return _REFERENCE["mixed"]


@pytest.mark.parametrize("vllm_fault", ["none", "H-c"])
@pytest.mark.parametrize("corruption,every", [(c, True) for c in sorted(CORRUPTIONS)]
                         + [("all-replicas-zero", False)])
def test_guard_exact_under_corruption_of_its_own_state(live_engine, corruption, every,
                                                       vllm_fault):
    eng = live_engine.get("mtp")
    ref = _healthy_reference(eng)
    assert all(o.honored is True for o, b in zip(ref, MIXED_BUDGETS) if b is not None)
    write, want_fields = CORRUPTIONS[corruption]
    start_id = eng.effective["reasoning_start_token_ids"][0]
    end = eng.effective["reasoning_end_token_ids"]
    handle = faults.inject(vllm_fault, engine=eng) if vllm_fault != "none" else None
    try:
        with guard.enabled(), _GuardStateWriter(write, start_id, every) as w, \
                request.zeroed_lm_head(eng), experiments.StepCounter() as c:
            outs = request.run_budgets(eng, MIXED_BUDGETS, max_tokens=MIXED_MAX_TOKENS)
            rep = guard.report(eng.runner)
            table = guard.repairs_table(eng.runner)
    finally:
        if handle is not None:
            handle.remove()
    assert w.writes >= 1 and c.draft_tokens > 0
    # tokens: exactly healthy vLLM's, request by request (budgeted = the rule; None untouched)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref], (corruption, vllm_fault)
    for o, b in zip(outs, MIXED_BUDGETS):
        if b is None:
            assert end[0] not in o.token_ids  # never forced where the host says: no budget
        else:
            assert o.honored is True and o.actual_end_index == o.expected_end_index
    if vllm_fault == "none":
        assert rep["fixed_tokens"] == 0  # vLLM forced by itself: nothing to replace
    else:
        assert rep["fixed_tokens"] > 0
    # every repair reported: which request, which field, found vs the host's truth
    recs = rep["repairs"]
    assert rep["repaired_fields"] == len(recs) > 0 and rep["repairs_dropped"] == 0
    assert {r["field"] for r in recs} == want_fields, recs[:5]
    budget_of = {_engine_id(r["req_id"], outs): b for r in recs
                 for o, b in zip(outs, MIXED_BUDGETS) if _engine_id(r["req_id"], outs) ==
                 o.request_id}
    assert set(budget_of) <= {o.request_id for o in outs}
    assert {r["req_id"] for r in recs} == set(rep["repaired_requests"])
    for r in recs:
        assert r["truth_from"] == "host" and any(v != r["truth"] for v in r["found"]), r
        if r["field"] == "budget":
            b = budget_of[_engine_id(r["req_id"], outs)]
            assert r["truth"] == (-1 if b is None else b), r
    if corruption == "all-replicas-zero":  # the unbudgeted requests' budget read 0, truth -1
        none_ids = {o.request_id for o, b in zip(outs, MIXED_BUDGETS) if b is None}
        assert any(_engine_id(r["req_id"], outs) in none_ids and r["found"] == [0, 0, 0]
                   and r["truth"] == -1 for r in recs if r["field"] == "budget")
    assert len(table) == len(recs) and list(table.columns) == guard.REPAIR_COLUMNS


def test_guard_section_in_the_pipeline_verdict_and_trace(live_engine, tmp_path):
    """``pipeline.run`` with the guard on: ``verdict.json["guard"]`` and ``trace/guard.parquet``
    carry the repairs of a writer that zeroes all three replicas."""
    from workbook.core import rundir, tracefiles
    from workbook.run import backends, pipeline

    eng = live_engine.get("mtp")
    cfg = eng.cfg.replace(guard=True, fault="H-c", zero_lm_head=True, trace=True,
                          thinking_token_budget=3, max_tokens=12)
    start_id = eng.effective["reasoning_start_token_ids"][0]
    out = str(tmp_path / "run")
    write, _ = CORRUPTIONS["all-replicas-zero"]
    with _GuardStateWriter(write, start_id, every=True):
        res = pipeline.run(cfg, out, backend=backends.InProcess(cfg, out, engine=eng))
    g = res.verdict["guard"]
    assert g["available"] and g["installed"] and g["fixed_tokens"] > 0
    assert g["repaired_fields"] > 0 and g["repairs"]
    assert res.outcome.honored is True
    saved = rundir.read_json(f"{out}/verdict.json")
    assert saved["guard"]["repaired_fields"] == g["repaired_fields"]
    assert saved["guard"]["repairs"] == g["repairs"]
    frames = tracefiles.load(f"{out}/trace")
    assert len(frames["guard"]) == g["repaired_fields"]
    assert {_engine_id(r, res.outcomes) for r in frames["guard"]["req_id"]} == \
        {res.outcome.request_id}
    # healthy vLLM with the guard on: the section says nothing was fixed or repaired
    cfg2 = eng.cfg.replace(guard=True, zero_lm_head=True, trace=True, thinking_token_budget=3,
                           max_tokens=12)
    res2 = pipeline.run(cfg2, None, backend=backends.InProcess(cfg2, None, engine=eng))
    assert res2.verdict["guard"]["fixed_tokens"] == 0
    assert res2.verdict["guard"]["repaired_fields"] == 0 and res2.verdict["guard"]["repairs"] == []


# ---- host twin of the kernel's walk (pure Python) ----------------------------------------------

@pytest.mark.parametrize("markers", sorted(MARKERS))
def test_host_advance_matches_the_budget_rule(markers):
    start, nat, end = MARKERS[markers]
    m = Markers(start, end, nat)
    tail_len = max(len(start) - 1, len(nat) - 1, len(end) - 1, 1)
    rng = random.Random(len(markers))
    for _ in range(300):
        hist = [rng.choice([0, 1, 2, 3, 4, 5, 6]) for _ in range(rng.randint(0, 8))]
        new = [rng.choice([0, 1, 2, 3, 4, 5, 6]) for _ in range(rng.randint(0, 6))]
        tail = ([-1] * tail_len + hist)[-tail_len:]
        cnt, t = guard.advance(guard.reasoning_count(hist, m), tail, new, m, tail_len)
        assert cnt == guard.reasoning_count(hist + new, m), (hist, new)
        assert t == ([-1] * tail_len + hist + new)[-tail_len:]


# ---- 7. no engine: GuardState over a simulated batch, an echo that lands late -----------------

def _fake_state(markers, max_num_reqs: int):
    import types

    import torch

    rc = types.SimpleNamespace(reasoning_start_token_ids=list(markers[0]),
                               natural_reasoning_end_token_ids=list(markers[1]),
                               reasoning_end_token_ids=list(markers[2]))
    return guard.GuardState(types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(reasoning_config=rc), device=torch.device(_device()),
        req_states=types.SimpleNamespace(max_num_reqs=max_num_reqs)))


class _Late:
    """A stand-in CUDA event that has not completed until ``done``."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True


@pytest.mark.parametrize("corrupt", ["one-replica", "all-replicas"])
def test_state_exact_when_an_echo_lands_late(corrupt):
    """Async scheduling: step 2's echo lands only at step 4. Rows of step 3 then take count and
    tail from the replicas' majority (``truth_from`` "replica majority"), the host absorbs the
    echoes in order and is current again; with one replica corrupted every step the tokens stay
    exact throughout; with all three corrupted they are exact in every step whose truth is
    current — the lagged step itself is the window the guard's docstring names."""
    import types

    import torch

    markers = ([1], [3], [3])
    m = Markers(*markers[:1], markers[2], markers[1])
    st = _fake_state(markers, 8)
    rng = random.Random(3)
    slots, ids = [5, 2, 7, 0], ["a", "b", "c", "d"]
    budgets = [None, 2, 4, 7]
    hists = [[9, 1, 0], [9, 1], [1, 0, 0], [9, 9, 1]]
    for s, b, h, r in zip(slots, budgets, hists, ids):
        st.stage(s, b, h, r)
    st.flush()
    late: list = []
    absorb = st._absorb

    def deferring(p):
        if p.event is None and p.seq == 2:  # this step's echo is still on its way
            p.event = _Late()
            late.append(p.event)
            st._pending.append(p)
            return
        absorb(p)

    st._absorb = deferring
    for step in range(7):
        if step == 4:
            late[0].done = True
        with torch.inference_mode():
            reps = st.replicas if corrupt == "all-replicas" else st.replicas[:1]
            for r in reps:
                torch.empty(0, dtype=r.dtype).set_(r.untyped_storage(), r.storage_offset(),
                                                   r.size(), r.stride()).fill_(0)
        rows = [[rng.choice([0, 0, 4, 3]) for _ in range(5)] for _ in ids]
        ns = [rng.randint(1, 5) for _ in ids]
        sampled = torch.tensor(rows, dtype=torch.int64)
        num_sampled = torch.tensor(ns, dtype=torch.int32)
        st.enforce(types.SimpleNamespace(sampled_token_ids=sampled), num_sampled,
                   torch.zeros(4, dtype=torch.int32), types.SimpleNamespace(req_ids=ids))
        for i in range(4):
            want = list(rows[i][:ns[i]]) if budgets[i] is None else \
                _rule_fixed(hists[i], rows[i][:ns[i]], budgets[i], m)
            got = sampled[i, :int(num_sampled[i])].tolist()
            if corrupt == "one-replica" or step != 3:
                assert got == want, (step, i, got, want)
            hists[i] = hists[i] + got
    rep = st.report()
    assert rep["truth_lagged_rows"] == 3  # the three budgeted rows of step 3
    lagged = [r for r in rep["repairs"] if r["truth_from"] == "replica majority"]
    if corrupt == "one-replica":  # the odd replica out-voted and reported in the lagged step
        assert lagged and {r["guard_step"] for r in lagged} == {3}
    else:  # three replicas that agree cannot be caught without the host: the window named
        assert lagged == []
    assert all(r["truth_from"] == "host" for r in rep["repairs"] if r["guard_step"] != 3)
    assert {r["guard_step"] for r in rep["repairs"]} >= {0, 1, 2, 4, 5, 6}
    assert not st._pending and not st.lagged.any()
