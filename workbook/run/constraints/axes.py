"""The constraints grid's axes: the case space as data (``environments/constraints.yaml``).

An axis is a named list of values; each value is a set of ``RunConfig`` overrides (a mapping)
or, in the short form ``name: [v1, v2]``, a value of the ``RunConfig`` field ``name`` itself.
The first value is the axis' default. The grid is constraint x method x batch x the points of
the axes an entry (or ``--axis``) gives: their product (``vary: product``, the default) or the
default point plus each other value of each axis alone (``vary: one``). A point is a mapping
axis -> value name; its configuration is the grid's base ``RunConfig`` with the values'
overrides (``Axes.config``). Keys of an axis definition:

- ``values``     value name -> overrides (or the short form: a list of field values);
- ``spec_only``  the axis changes only the drafter (method ``none`` runs its default value
                 only, and the differential's reference ignores it);
- ``requires``   ``RunConfig`` fields the axis needs: a branch without them keeps the axis
                 declared, and its non-default cells say "not available" (nothing runs);
- ``verify``     what must be seen for a cell to count as run at that value, read from vLLM:
                 ``preemption`` (the request's ``Request.num_preemptions`` > 0), ``async``
                 (the engine core has a batch queue), ``steered`` (a draft row was steered),
                 ``cached`` (vLLM reports prefix-cache hits: ``RequestOutput.num_cached_tokens``
                 > 0), ``accepted`` (a draft of the request was accepted), ``samples`` (every
                 one of the request's ``n`` outputs was judged): a cell that did not reach it
                 says so (``Cell.unreached``); a mapping value -> what gives it per value;
- ``gpu_only``   values that need a GPU (CUDA graphs): on the CPU platform selecting one is a
                 ``ConfigError`` naming it, before any engine starts;
- ``reference``  value -> the value of the same axis whose cells it must equal (same method,
                 batch, constraint and other axes): the requests the point sends are the
                 reference's, plus what the value adds (e.g. an aborted neighbour), so every
                 output must be token for token the reference's (``invariance``).

Whether two points need different engines is ``workbook.vllm.engine.engine_key`` of their
configurations: request-level axes (arrival, the drafter steer) share one engine. Bad input —
an unknown axis or value, a value naming no ``RunConfig`` field, a value ``validate`` rejects —
is a ``ConfigError`` naming the axis and value before any engine starts.

Also here, used by ``workbook.run.constraints.cases.run_batch``: ``generate`` (the arrival axis:
all at step 0 or staggered over steps) and ``steer_plan`` (the drafter axis' plans).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from workbook.core.config import ConfigError, RunConfig

VARY = ("product", "one")
VERIFY = ("preemption", "async", "steered", "cached", "accepted", "samples")


@dataclass
class Axis:
    name: str
    values: dict[str, dict[str, Any]]  # value name -> RunConfig overrides; first = default
    spec_only: bool = False
    requires: tuple[str, ...] = ()
    verify: str | dict | None = None  # one check for every value, or value -> check
    gpu_only: tuple[str, ...] = ()
    reference: dict[str, str] = field(default_factory=dict)  # value -> the value it must equal

    def verify_of(self, value: str) -> str | None:
        return self.verify.get(value) if isinstance(self.verify, dict) else self.verify

    @property
    def default(self) -> str:
        return next(iter(self.values))

    @property
    def available(self) -> bool:
        names = set(RunConfig.field_names())
        return all(r in names for r in self.requires)

    def missing(self) -> list[str]:
        names = set(RunConfig.field_names())
        return [r for r in self.requires if r not in names]


def _value_name(v) -> str:
    return {True: "on", False: "off", None: "default"}.get(v, str(v)) \
        if isinstance(v, (bool, type(None))) else str(v)


def parse(raw: dict | None) -> dict[str, Axis]:
    """The environment's ``axes:`` mapping as ``Axis`` objects (``ConfigError`` when malformed
    or naming no ``RunConfig`` field)."""
    fields = set(RunConfig.field_names())
    out: dict[str, Axis] = {}
    for name, d in (raw or {}).items():
        if isinstance(d, list):
            d = {"values": d}
        if not isinstance(d, dict) or "values" not in d:
            raise ConfigError(f"axis {name!r}: expected a list of values or a mapping with "
                              "'values'")
        bad = sorted(set(d) - {"values", "spec_only", "requires", "verify", "description",
                               "gpu_only", "reference"})
        if bad:
            raise ConfigError(f"axis {name!r}: unknown key(s) {bad}")
        vals = d["values"]
        if isinstance(vals, list):
            if name not in fields:
                raise ConfigError(f"axis {name!r}: a list of values needs a RunConfig field "
                                  f"named {name!r}; give 'values' as name -> overrides")
            vals = {_value_name(v): {name: v} for v in vals}
        if not isinstance(vals, dict) or not vals:
            raise ConfigError(f"axis {name!r}: 'values' is empty or not a mapping")
        requires = tuple(d.get("requires") or ())
        for v, over in vals.items():
            if not isinstance(over, dict):
                raise ConfigError(f"axis {name!r} value {v!r}: expected a mapping of "
                                  "RunConfig fields")
            unknown = sorted(set(over) - fields - set(requires))
            if unknown:
                raise ConfigError(f"axis {name!r} value {v!r}: unknown RunConfig field(s) "
                                  f"{unknown}")
        verify = d.get("verify")
        for v in (verify.values() if isinstance(verify, dict) else [verify]):
            if v is not None and v not in VERIFY:
                raise ConfigError(f"axis {name!r}: verify={v!r} is unknown; choose one of "
                                  f"{VERIFY}")
        gpu_only = tuple(str(v) for v in d.get("gpu_only") or ())
        ref = {str(k): str(v) for k, v in (d.get("reference") or {}).items()}
        names = [str(k) for k in vals]
        for what, given in (("verify", list(verify) if isinstance(verify, dict) else []),
                            ("gpu_only", list(gpu_only)),
                            ("reference", list(ref) + list(ref.values()))):
            bad = [v for v in given if str(v) not in names]
            if bad:
                raise ConfigError(f"axis {name!r}: {what} names value {bad[0]!r}, which it "
                                  f"does not have; values: {', '.join(names)}")
        out[str(name)] = Axis(str(name), {str(k): dict(v) for k, v in vals.items()},
                              bool(d.get("spec_only")), requires, verify, gpu_only, ref)
    return out


def select(known: dict[str, Axis], given) -> dict[str, list[str]]:
    """The axes an entry / ``--axis`` gives: a list of names (every value), a mapping name ->
    values, or ``NAME=V1,V2`` strings; ``ConfigError`` naming an unknown axis or value."""
    if not given:
        return {}
    if isinstance(given, str):
        given = [given]
    if isinstance(given, list):
        sel: dict[str, list[str]] = {}
        for g in given:
            name, _, vals = str(g).partition("=")
            sel[name.strip()] = [v.strip() for v in vals.split(",") if v.strip()] or None
        given = sel
    if not isinstance(given, dict):
        raise ConfigError(f"axes: expected a list of axis names or a mapping, got {given!r}")
    out = {}
    for name, vals in given.items():
        if name not in known:
            raise ConfigError(f"axis {name!r} is unknown; known: {', '.join(known) or 'none'}")
        ax = known[name]
        vals = list(ax.values) if vals is None else [_value_name(v) for v in (
            vals if isinstance(vals, list) else [vals])]
        bad = [v for v in vals if v not in ax.values]
        if bad:
            raise ConfigError(f"axis {name!r}: value {bad[0]!r} is unknown; known: "
                              f"{', '.join(ax.values)}")
        out[name] = list(dict.fromkeys(vals))
    return out


def points(known: dict[str, Axis], sel: dict[str, list[str]], vary: str = "product"
           ) -> list[dict[str, str]]:
    """The grid points of the selected axes (``{}`` alone when none is selected); the default
    point first."""
    if vary not in VARY:
        raise ConfigError(f"vary={vary!r} is unknown; choose one of {VARY}")
    if not sel:
        return [{}]
    names = list(sel)
    if vary == "product":
        pts = [dict(zip(names, combo)) for combo in itertools.product(*(sel[n] for n in names))]
    else:
        base = {n: (known[n].default if known[n].default in sel[n] else sel[n][0])
                for n in names}
        pts = [dict(base)] + [{**base, n: v} for n in names for v in sel[n] if v != base[n]]
    defaults = {n: known[n].default for n in names}
    pts.sort(key=lambda p: sum(p[n] != defaults[n] for n in names))
    return pts


def overrides(known: dict[str, Axis], point: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, v in point.items():
        for k, val in known[n].values[v].items():
            if k == "engine_kwargs" and isinstance(val, dict):
                out["engine_kwargs"] = {**out.get("engine_kwargs", {}), **val}
            else:
                out[k] = val
    return out


def unavailable(known: dict[str, Axis], point: dict[str, str]) -> str | None:
    """Why ``point`` cannot run on this branch (an axis whose fields ``RunConfig`` lacks, at a
    value other than its default), else None."""
    for n, v in point.items():
        ax = known[n]
        if not ax.available and ax.values[v]:
            return (f"not available: axis {n!r} needs RunConfig field(s) "
                    f"{', '.join(ax.missing())}, which this workbook does not have yet")
    return None


def config(base: RunConfig, known: dict[str, Axis], point: dict[str, str]) -> RunConfig:
    over = overrides(known, point)
    if "engine_kwargs" in over:
        over["engine_kwargs"] = {**base.engine_kwargs, **over["engine_kwargs"]}
    return base.replace(**over)


def runs_for(method: str, known: dict[str, Axis], point: dict[str, str]) -> bool:
    """Method ``none`` runs a spec-only axis at its default value only (it has no drafter)."""
    return method != "none" or all(point[n] == known[n].default for n in point
                                   if known[n].spec_only)


def label(point: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "default"


def generate(llm, prompts: list[dict], sps: list, arrival: str = "step0", filler=None,
             every: int = 2, priorities: list[int] | None = None,
             abort: tuple | None = None) -> list:
    """Send ``prompts`` with ``sps`` on the in-process ``llm``; the finished ``RequestOutput``s
    in the same order. ``step0``: one ``LLM.generate`` (every request added before the first
    step); ``staggered``: request i is added to the engine at step ``every * i`` through
    vLLM's own ``LLMEngine.add_request`` / ``step`` (it joins a running batch); with ``filler``
    (a prompt) an unconstrained request arrives first and the batch's requests join it —
    a batch of one request is otherwise never staggered. ``priorities``: vLLM's request
    priority per request (priority scheduling). ``abort``: ``(prompt, params, at)`` — that
    request is added at step 0 with the first half of the batch, aborted through
    ``LLMEngine.abort_request`` after step ``at`` while the batch runs on, and the second half
    of the batch (all of a batch of one) arrives at the next step, into the slots it freed.
    Outputs are matched by prompt."""
    if arrival == "step0" and abort is None:
        kw = {"priority": list(priorities)} if priorities is not None else {}
        return llm.generate(prompts, sps, use_tqdm=False, **kw)
    eng = llm.llm_engine
    pri = list(priorities) if priorities is not None else [0] * len(prompts)
    queue = [(f"wb-arrive-{next(_ids)}", p, sp, pr) for p, sp, pr in zip(prompts, sps, pri)]
    from workbook.run.constraints.caseparams import sampling_params

    if filler is not None and abort is None:  # unconstrained, as long as the first request
        queue.insert(0, (f"wb-arrive-{next(_ids)}", filler,
                         sampling_params({}, int(getattr(sps[0], "max_tokens", 16) or 16)),
                         max(pri) + 1 if priorities is not None else 0))
    if abort is None:
        at = {rid: every * i for i, (rid, *_) in enumerate(queue)}
        cut, victim = None, None
    else:
        victim = (f"wb-abort-{next(_ids)}", abort[0], abort[1],
                  max(pri) + 1 if priorities is not None else 0)
        cut = int(abort[2])
        half = len(queue) // 2
        at = {rid: (0 if i < half else cut + 1) for i, (rid, *_) in enumerate(queue)}
        queue.insert(0, victim)
        at[victim[0]] = 0
    done: dict[tuple, Any] = {}
    step = 0
    for _ in itertools.count():
        while queue and at[queue[0][0]] <= step:
            rid, p, sp, pr = queue.pop(0)
            eng.add_request(rid, p, sp, priority=pr)
        for o in eng.step():
            if o.finished:
                done[tuple(o.prompt_token_ids or ())] = o
        if victim is not None and step == cut:
            eng.abort_request([victim[0]])
        step += 1
        if not queue and not eng.has_unfinished_requests():
            break
        if step > 100000:
            raise RuntimeError("staggered arrival: the engine did not finish")
    return [done[tuple(p["prompt_token_ids"])] for p in prompts]


# the aborted request's constraints (axis abort): every per-slot state MRV2 keeps for a request
# (budget, allowed-token mask, min_tokens' stop mask, penalties, bad words, logprobs), so a
# state its slot keeps after the abort shows on the next occupant's rows
VICTIM_CASES = ("thinking_token_budget", "allowed_token_ids", "min_tokens", "penalties",
                "bad_words", "logprobs")


def victim_kwargs(cases: dict[str, dict]) -> dict:
    """The aborted request's ``SamplingParams`` keywords: the grid's own cases of
    ``VICTIM_CASES`` (``contracts.case_kwargs``) merged."""
    kw: dict = {}
    for c in VICTIM_CASES:
        kw.update(cases.get(c) or {})
    return kw


def priorities(n: int, mode: str) -> list[int] | None:
    """vLLM's request priorities for a batch of ``n`` (lower is served first): ``mixed`` gives
    later requests the more urgent value (so with staggered arrival a late one preempts an
    earlier one when the KV cache is short), ``none`` none."""
    if mode == "none":
        return None
    return [n - i for i in range(n)]


PREFIX_TEXT = "Think it through step by step before you answer."


def with_prefix(tokenizer, prompt: list[int], length: int) -> list[int]:
    """``prompt`` after one shared reasoning prefix of ``length`` tokens (0: ``prompt`` as
    is): a chat turn ``PREFIX_TEXT`` whose answer opens ``<think>`` and reasons (filler tokens
    cycling through ids 20..99), cut to ``length``, so every prompt of a batch shares its
    blocks (prefix caching) and a long prompt needs several prefill steps (chunked prefill);
    the case's own prompt follows, with its own markers."""
    if length <= 0:
        return list(prompt)
    head = tokenizer.apply_chat_template([{"role": "user", "content": PREFIX_TEXT}],
                                         add_generation_prompt=True, tokenize=True,
                                         enable_thinking=True)
    if isinstance(head, dict) or hasattr(head, "input_ids"):
        head = head["input_ids"]
    head = [int(t) for t in head]
    filler = [20 + i % 80 for i in range(max(0, length - len(head)))]
    return (head + filler)[:length] + list(prompt)


_ids = itertools.count()


def refusals(llm, prompts: list[dict], sps: list) -> dict[int, Exception]:
    """The requests vLLM refuses (its own validation when a request is added, e.g. "The min_p
    and logit_bias sampling parameters are not yet supported with speculative decoding"),
    found before the batch is sent so one refused request does not take its batch with it:
    each is added through ``LLMEngine.add_request`` and, when accepted, aborted at once
    (nothing is scheduled: no step runs in between). Returns index -> vLLM's exception."""
    from workbook.run.constraints.caseparams import is_refusal

    eng = llm.llm_engine
    out: dict[int, Exception] = {}
    for i, (p, sp) in enumerate(zip(prompts, sps)):
        rid = f"wb-probe-{next(_ids)}"
        try:
            eng.add_request(rid, p, sp)
        except Exception as e:
            if not is_refusal(e):
                raise
            out[i] = e
            continue
        eng.abort_request([rid])
    return out


def steer_plan(mode: str, name: str, kw: dict, reference: list[int] | None, encode=None
               ) -> list[int] | None:
    """The drafter's steering plan for case ``name`` (keywords ``kw``): a token per output
    index (the last repeated; ``hooks.steer``). ``greedy``: ``reference``, the target's own
    greedy output for the same request without speculation; ``forbidden``: a token the
    constraint forbids (a stop id before ``min_tokens``, a token outside
    ``allowed_token_ids``, a negatively biased column, a bad word's last token, the reasoning
    token past the budget, a token the JSON grammar rejects); ``allowed``: a token the
    constraint allows that is not the greedy choice (so the draft reaches verification and is
    rejected by value, not by a mask). None where the constraint forbids nothing (penalties,
    max_tokens, logprobs, prompt logprobs, stop strings): the drafter stays as is.
    ``encode(str) -> ids`` for bad words."""
    ref = [int(t) for t in (reference or [])]
    if mode == "greedy":
        return ref or None
    allowed = kw.get("allowed_token_ids")
    stops = [int(t) for t in kw.get("stop_token_ids") or []]
    neg = [int(k) for k, v in (kw.get("logit_bias") or {}).items() if float(v) < 0]
    words = []
    for w in kw.get("bad_words") or []:
        ids = encode(w) if encode is not None else []
        if ids:
            words.append(int(ids[-1]))
    banned = set(stops) | set(neg) | set(words)
    if mode == "forbidden":
        if allowed:
            return [next(t for t in range(1 << 20) if t not in allowed)]
        if "min_tokens" in kw and stops:
            return [stops[0]]
        if neg or words:
            return [(neg or words)[0]]
        if kw.get("structured_outputs"):
            return [0]  # "!": no JSON value starts with it
        if kw.get("thinking_token_budget") is not None and ref:
            return [ref[0]]  # the reasoning token, forbidden once the budget binds
        return None
    if mode == "allowed":
        if allowed:
            return [max(int(t) for t in allowed)]
        if kw.get("structured_outputs"):
            return ref or None  # the grammar's own continuation
        return [next(t for t in range(1, 1 << 20) if t not in banned and t not in set(ref))]
    raise ValueError(f"drafter steer {mode!r} is unknown")




def verify(cells: list, known: dict[str, Axis], point: dict[str, str], facts: dict) -> None:
    """Mark each judged cell of ``point`` that did not reach an axis value's ``verify`` (vLLM's
    own evidence: ``Cell.preemptions``, ``facts['async']`` — the engine's batch queue —,
    ``Cell.steered``, ``Cell.cached_tokens``, ``Cell.accepted_drafts``, ``Cell.samples``):
    ``Cell.unreached`` gets a sentence saying what did not happen."""
    for n, v in point.items():
        ax = known[n]
        check = ax.verify_of(v)
        if check is None or v == ax.default:
            continue
        for c in cells:
            if c.status in ("refused", "method refused", "error", "not available", "not run"):
                continue
            note = None
            if check == "preemption":
                if c.preemptions is None:
                    note = (f"{n}={v}: not verified (this vLLM's Request has no "
                            "num_preemptions counter)")
                elif c.preemptions == 0:
                    note = (f"{n}={v}: vLLM preempted this request 0 times ("
                            + str(facts.get("preemption_counter") or "Request.num_preemptions")
                            + "): it did not run preempted")
            elif check == "async" and facts.get("async") is not True:
                note = (f"{n}={v}: the engine ran without async scheduling (its engine core "
                        "has no batch queue)")
            elif check == "steered" and c.method != "none" and not c.steered:
                note = f"{n}={v}: no draft row of this request was steered"
            elif check == "cached" and not c.cached_tokens:
                note = (f"{n}={v}: vLLM reports no prefix-cache hit for this request "
                        "(RequestOutput.num_cached_tokens is "
                        f"{'not reported' if c.cached_tokens is None else 0})")
            elif check == "accepted" and c.method != "none" and not c.accepted_drafts:
                note = f"{n}={v}: no draft of this request was accepted"
            elif check == "samples":
                want = max(int(x.get("n") or 1) for x in (c.samples or [{"n": 1}]))
                if len(c.samples or []) < max(2, want):
                    note = (f"{n}={v}: {len(c.samples or [])} of the request's outputs were "
                            "judged one by one")
            if note:
                c.unreached = list(c.unreached or []) + [note]


def gpu_refusal(known: dict[str, Axis], pts: list[dict[str, str]], on_cpu: bool | None
                ) -> str | None:
    """On the CPU platform, the first selected axis value that needs a GPU (``gpu_only``),
    as a sentence; else None."""
    if not on_cpu:
        return None
    for pt in pts:
        for n, v in pt.items():
            if v in known[n].gpu_only:
                others = [x for x in known[n].values if x not in known[n].gpu_only]
                return (f"axis {n!r} value {v!r} needs a GPU (CUDA graphs); this is the CPU "
                        f"platform: choose {', '.join(others)}")
    return None


def invariance(cells: list, known: dict[str, Axis], locate=None) -> None:
    """Each cell at a point whose axis value has a ``reference`` against the cell of the same
    constraint, method and batch at the point with the reference value: its output must be
    token for token the reference's (``contracts.first_divergence``). A divergence is located
    in both cells' row evidence (``locate(cell, out_index)`` -> step, row, the row's
    top-1/top-2 margin: the grid's ``cases.emitted_at``); where either row is a near tie
    (``contracts.close``: numerics of a different batch, not a constraint) or neither is
    located it is recorded (``near_tie``: no claim), else it is a violation at
    stage ``differential vs <axis>=<reference>``. Only judged cells; filled once per cell
    (``Cell.invariance``)."""
    from workbook.core import contracts

    refs = {n: a.reference for n, a in known.items() if a.reference}
    if not refs:
        return
    judged = ("holds", "violated", "not judged")
    key = lambda c, pt: (c.constraint, c.method, c.batch, tuple(sorted(pt.items())))
    index = {key(c, c.axes or {}): c for c in cells}
    where = locate or (lambda c, i: {})
    for c in cells:
        if c.invariance is not None:
            continue
        for n, v in (c.axes or {}).items():
            r = refs.get(n, {}).get(v)
            if r is None:
                continue
            ref = index.get(key(c, {**c.axes, n: r}))
            if ref is None or c.status not in judged or ref.status not in judged:
                continue
            i = contracts.first_divergence(c.output, ref.output)
            c.invariance = {"vs": f"{n}={r}", "identical": i is None, "tokens": len(c.output)}
            if i is None:
                continue
            at, at_ref = where(c, i), where(ref, i)
            margins = [x["margin"] for x in (at, at_ref) if x.get("margin") is not None]
            tie = not margins or any(contracts.close(m, 0.0) for m in margins)
            c.invariance.update(out_index=i, token=c.output[i] if i < len(c.output) else None,
                                reference_token=ref.output[i] if i < len(ref.output) else None,
                                step=at.get("step"), row=at.get("row"), margins=margins,
                                near_tie=tie)
            if c.status != "violated" and not tie:
                c.status, c.breaches = "violated", c.breaches + 1
                c.first = {"step": at.get("step"), "row": at.get("row"),
                           "local_pos": at.get("local_pos"),
                           "stage": f"differential vs {n}={r}", "contract": c.constraint,
                           "what": f"output index {i}: token {c.invariance['token']} where "
                                   f"the same request at {n}={r} has "
                                   f"{c.invariance['reference_token']} (top-1/top-2 margins "
                                   f"{', '.join(f'{m:.3g}' for m in margins) or 'not recorded'})",
                           "column": c.invariance["token"], "out_index": i}
