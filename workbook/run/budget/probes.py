"""Automatic probes: re-run the violating request with one switch, to confirm its cause.

A verdict lists, for each cause that fits, "what would confirm it"; when the run asks for it
(``RunConfig.probes``, ``workbook run --probes``), the pipeline runs those checks right after the
diagnosis, on the same in-process engine, and feeds the results back into the verdict
(``workbook.run.budget.diagnose.with_probes``). Each probe is the violating request (its budget and
``max_tokens``, the run's weights) re-sent with exactly one switch, traced and diagnosed on its
own:

  =========  =====================================================================  ==========
  probe      switch                                                                 cost
  =========  =====================================================================  ==========
  alone      the violating request alone (batch of 1) — when the run was batched    a request
  batched    in a batch of several mixed budgets — when the run was a batch of 1    a request
  markers    the state's marker ids re-uploaded from the host reasoning config      a request
             before every apply (through a raw alias; the found values restored)
  budget     the device budget view re-copied from the host before every apply      a request
  caches     the marker caches of the batch reset before every apply (cold scan)    a request
  guard      the commit-time guard on (the fix)                                     a request
  no_spec    speculative decoding off                                               an engine
  eager      eager instead of CUDA graphs (GPU, when the run used graphs)           an engine
  v1         the V1 runner                                                          an engine
  =========  =====================================================================  ==========

``plan`` picks, from the catalogue's predictions (``Hypothesis.predicts``), the probes whose
outcome separates the remaining candidates, those that would confirm a single one, and the
guard; probes that need a new engine (20–90 s on a CPU) only when no cheap probe separates the
candidates, and only for the tiny models (a second engine of a real checkpoint would not fit
next to the first: those stay A/B variants of notebook 03). ``run`` executes a plan and returns ``{name: result}`` (``probes.json``).

Not here: what a result means (``workbook.run.budget.diagnose.with_probes``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from workbook.core import models
from workbook.core.hypotheses import HYPOTHESES


@dataclass(frozen=True)
class Probe:
    name: str
    switch: str
    needs_engine: bool = False  # a new engine (20–90 s on a CPU)
    gpu_only: bool = False


PROBES: dict[str, Probe] = {p.name: p for p in [
    Probe("alone", "the violating request alone (batch of 1)"),
    Probe("batched", "the violating request in a batch of several mixed budgets"),
    Probe("markers", "marker ids re-uploaded from the host reasoning config before every apply"),
    Probe("budget", "device budget view re-copied from the host before every apply"),
    Probe("caches", "marker caches reset before every apply (cold scan of the history)"),
    Probe("guard", "the commit-time budget guard on"),
    Probe("no_spec", "speculative decoding off (MTP off)", needs_engine=True),
    Probe("eager", "eager mode instead of CUDA graphs", needs_engine=True, gpu_only=True),
    Probe("v1", "the V1 model runner", needs_engine=True),
]}
CHEAP_UNCLASSIFIED = ("markers", "budget", "caches", "guard")


def _batch_size(verdict: dict) -> int:
    fv = verdict.get("first_violation") or {}
    return int(fv.get("batch_size") or len(verdict.get("requests") or []) or 1)


def applicable(name: str, verdict: dict, cfg, on_cpu: bool) -> str | None:
    """Why probe ``name`` cannot run for this run, or None."""
    p = PROBES[name]
    if p.needs_engine and getattr(cfg, "model", "") not in models.MODELS:
        return ("needs a second engine of this checkpoint next to the first (memory): run it "
                "as an A/B variant (notebook 03)")
    if name == "alone" and _batch_size(verdict) <= 1:
        return "the run already was a batch of 1"
    if name == "batched" and _batch_size(verdict) > 1:
        return "the run already was a batch of several"
    if p.gpu_only and on_cpu:
        return "needs a GPU (the CPU platform runs eager)"
    if name == "eager" and getattr(cfg, "enforce_eager", True):
        return "the run already was eager"
    if name == "no_spec" and getattr(cfg, "spec_method", "none") == "none":
        return "the run had no speculative decoding"
    if name == "v1" and getattr(cfg, "runner", "v2") != "v2":
        return "the run was not on V2"
    return None


def plan(verdict: dict, cfg, *, on_cpu: bool = True) -> list[str]:
    """The probes worth running for ``verdict`` (empty unless it is violated)."""
    if verdict.get("verdict") != "violated" or verdict.get("hypothesis") == "H-h":
        return []
    cands = [c["hypothesis"] for c in verdict.get("causes") or [] if c["hypothesis"] in
             HYPOTHESES]
    ok = [n for n in PROBES if applicable(n, verdict, cfg, on_cpu) is None]
    cheap = [n for n in ok if not PROBES[n].needs_engine]
    if not cands:  # unclassified: every cheap probe may bring positive evidence
        return [n for n in cheap if n in ("alone", "batched") or n in CHEAP_UNCLASSIFIED]

    def preds(n):
        return {HYPOTHESES[c].predicts.get(n) for c in cands}

    chosen = []
    if len(cands) > 1:
        chosen = [n for n in cheap if {"honored", "violated"} <= preds(n)]
        if not chosen:
            chosen = [n for n in ok if PROBES[n].needs_engine
                      and {"honored", "violated"} <= preds(n)][:1]
    else:
        chosen = [n for n in cheap if preds(n) == {"honored"} and n != "guard"]
    if "guard" in cheap:
        chosen.append("guard")
    return chosen


# ---- the switches --------------------------------------------------------------------------

def _repair(name: str, fn):
    """A removable patch (layer "guard": above any fault, below the tracer) that calls
    ``fn(state, idx_mapping)`` before every ``ThinkingBudgetState.apply``."""
    from workbook.vllm import hookpoints, patching

    hp = hookpoints.resolve()
    ps = patching.PatchSet(f"probe:{name}", "guard")

    def make(orig):
        def apply(state, *a, **k):
            if getattr(state, "enabled", False):
                args = hookpoints.budget_apply_args(hp.generation, a, k)
                fn(state, args.idx_mapping)
            return orig(state, *a, **k)
        return apply

    ps.wrap(hp.budget, "apply", make)
    return ps


@contextlib.contextmanager
def _markers_reuploaded(engine):
    import torch

    from workbook.hooks.faults.budget import MARKER_ATTRS, raw_alias

    rc = engine.runner.vllm_config.reasoning_config
    want = {n: [int(t) for t in (getattr(rc, n, None) or [])] for n in MARKER_ATTRS}
    found: dict = {}

    def fix(state, _idx):
        with torch.inference_mode():
            for n in MARKER_ATTRS:
                t = getattr(state, n)
                if t.numel() != len(want[n]):
                    continue
                if (state, n) not in found:
                    found[(state, n)] = t.detach().clone()
                raw_alias(t).copy_(torch.tensor(want[n], dtype=t.dtype, device=t.device))

    ps = _repair("markers", fix).install()
    try:
        yield
    finally:
        ps.remove()
        with torch.inference_mode():  # leave the engine as found (a probe is an observation)
            for (state, n), vals in found.items():
                raw_alias(getattr(state, n)).copy_(vals)


@contextlib.contextmanager
def _budget_recopied(engine):
    def fix(state, _idx):
        state.thinking_token_budget.copy_to_uva()

    ps = _repair("budget", fix).install()
    try:
        yield
    finally:
        ps.remove()


@contextlib.contextmanager
def _caches_reset(engine):
    import torch

    def fix(state, idx):
        with torch.inference_mode():
            i = idx.long()
            state.cached_last_start.index_fill_(0, i, -1)
            state.cached_last_end.index_fill_(0, i, -1)
            state.cached_scan_pos.index_fill_(0, i, 0)

    ps = _repair("caches", fix).install()
    try:
        yield
    finally:
        ps.remove()


@contextlib.contextmanager
def _guard_on(engine):
    from workbook.hooks import guard

    with guard.enabled():
        yield


def _recorrupted(name: str, frames: dict, request_id: str) -> str | None:
    """Positive evidence that what a repair probe wrote was changed again: its own trace, at
    the violating request's steps, read the repaired value (after the repair, when the kernel
    read it) and found it wrong. None when it held (or the probe repairs nothing)."""
    from workbook.run import verdicts

    if name not in ("markers", "budget", "caches"):
        return None
    steps = sorted((s for s in verdicts.records(frames.get("requests"))
                    if s["req_id"] == request_id or str(s["req_id"]).startswith(
                        f"{request_id}-")), key=lambda s: s["step"])
    for s in steps:
        if name == "markers" and s.get("markers_ok") is False:
            return f"step {s['step']}: marker ids {s.get('markers_dev')}"
        bd, bh = s.get("budget_device"), s.get("budget_host")
        if name == "budget" and bd is not None and bh is not None and int(bd) != int(bh):
            return f"step {s['step']}: device budget {bd}, host {bh}"
        if name == "caches" and s.get("cache_before_ok") is False:
            return (f"step {s['step']}: marker cache entering apply last_start="
                    f"{s.get('last_start_before')} last_end={s.get('last_end_before')}")
    return None


SWITCHES = {"markers": _markers_reuploaded, "budget": _budget_recopied,
            "caches": _caches_reset, "guard": _guard_on}


# ---- running -------------------------------------------------------------------------------

def _int(b) -> int | None:
    """A budget as vLLM takes it: an int or None (a verdict read back from JSON, or written
    by an older diagnosis, may hold 1.0; vLLM rejects it)."""
    return None if b is None else int(b)


def _target(verdict: dict) -> tuple[bool, int | None, list]:
    """(a violating request found, its budget — None: it asked for none —, the run's batch
    budgets in order)."""
    fv = verdict.get("first_violation") or {}
    req = next((r for r in verdict.get("requests") or []
                if r.get("req_id") == fv.get("req_id")), {})
    b = fv.get("budget") if "budget" in fv else req.get("budget")
    if b is None:
        b = req.get("budget")
    others = [_int(r.get("budget")) for r in verdict.get("requests") or []]
    return bool(fv or req), _int(b), others


def _budgets(name: str, b: int | None, others: list) -> list:
    if name == "alone":
        return [b]
    if name == "batched":
        return [b, (b + 3) if b is not None else 3, None if b is not None else 1]
    return _same_batch(b, others)


def _same_batch(b, others: list) -> list:
    """The run's own batch, violating request first (same composition, same order kept for
    the others)."""
    if not others:
        return [b]
    rest = list(others)
    if b in rest:
        rest.remove(b)
    return [b] + rest


def run(engine, cfg, verdict: dict, names=None, *, zero_lm_head: bool | None = None,
        max_tokens: int | None = None, on_cpu: bool | None = None,
        params: dict | None = None) -> dict:
    """Run ``names`` (default ``plan(verdict, cfg)``) on ``engine``; ``{name: result}``.

    ``zero_lm_head`` (default ``cfg.zero_lm_head``): send the probes under the zeroed target
    ``lm_head``, as the run was; ``params``: further ``SamplingParams`` fields the run's
    requests carried. Each result: ``switch``, ``ran``, ``why`` (when not run),
    ``budgets`` (the probe's batch, violating request first), ``verdict`` (of the violating
    request under the switch), ``tokens``, ``run_verdict``, ``hypothesis`` (the probe run's own
    diagnosis), ``summary``, ``seconds``.
    """
    from workbook.vllm import env

    on_cpu = env.on_cpu() if on_cpu is None else on_cpu
    names = plan(verdict, cfg, on_cpu=on_cpu) if names is None else list(names)
    zero = getattr(cfg, "zero_lm_head", False) if zero_lm_head is None else zero_lm_head
    mt = max_tokens or getattr(cfg, "max_tokens", 32)
    found, b, others = _target(verdict)
    kind = (verdict.get("first_violation") or {}).get("kind") or "missing"
    out: dict = {}
    for name in names:
        why = applicable(name, verdict, cfg, on_cpu)
        res = {"switch": PROBES[name].switch, "ran": False}
        if why or not found:
            res["why"] = why or "no violating request"
            out[name] = res
            continue
        budgets = _budgets(name, b, others)
        t0 = time.perf_counter()
        try:
            res.update(_one(name, engine, cfg, budgets, zero, mt, params or {}, kind))
            res["ran"] = True
        except Exception as e:  # a probe that fails is a finding, keep going
            res["why"] = f"{type(e).__name__}: {e}"[:300]
        res["budgets"] = budgets
        res["seconds"] = round(time.perf_counter() - t0, 2)
        out[name] = res
    return out


def _engine_for(name: str, engine, cfg):
    from workbook.vllm import engine as eng

    if name == "no_spec":
        return eng.shared(engine.cfg.replace(spec_method="none"))
    if name == "eager":
        return eng.shared(engine.cfg.replace(enforce_eager=True))
    if name == "v1":
        return eng.shared(engine.cfg.replace(runner="v1"))
    return engine


def _one(name, engine, cfg, budgets, zero, max_tokens, params, kind="missing") -> dict:
    from workbook.hooks.observe.tracer import Tracer
    from workbook.run import request
    from workbook.run.budget import diagnose

    eng = _engine_for(name, engine, cfg)
    switch = SWITCHES.get(name, lambda e: contextlib.nullcontext())
    weights = request.zeroed_lm_head(eng) if zero else contextlib.nullcontext()
    with switch(eng), weights, Tracer() as t:
        outs = request.run_budgets(eng, budgets, max_tokens, **params)
    frames = t.frames()
    v = diagnose.diagnose(frames, eng.effective, outs, eng.cfg)
    target = outs[0]
    # the violating request's verdict under the switch, on the side of the contract the run
    # broke (``kind``): the end where due (the client's judgement), or no forcing where not
    # due (seen in the probe's own trace only) — a switch is judged on the violation it is
    # meant to remove, not on the other side
    mine = [r for r in v.get("requests") or [] if r["req_id"] == target.request_id
            or str(r["req_id"]).startswith(f"{target.request_id}-")]
    honored = target.honored
    if kind != "missing" and len(mine) == 1:
        honored = False if mine[0].get("kind") in ("early", "unbudgeted", "twice") else (
            True if mine[0].get("forced") is not None else None)
    return {"verdict": {True: "honored", False: "violated", None: "inconclusive"}[honored],
            "recorrupted": _recorrupted(name, frames, target.request_id),
            "tokens": target.token_ids[:16], "run_verdict": v["verdict"],
            "hypothesis": v.get("hypothesis"),
            "causes": [c["hypothesis"] for c in v.get("causes") or []],
            "summary": v.get("summary", "")[:400]}
