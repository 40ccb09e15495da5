"""The constraints grid: every sampling constraint × speculative method × batch, on one engine
per method, judged row by row (evidence ``workbook.hooks.observe.rowcheck``, judged by
``workbook.run.constraints.rowjudge``), on the output
(``contracts.check_output``) and against the same greedy request without speculation (the
differential).

The grid itself — one engine per method, started through the pipeline's backends from
``environments/constraints.yaml`` (``none`` first: the differential's reference and the baseline
the cases are derived from), its run folder and its command — is ``workbook.run.constraints.grid``; this
module holds the cases and the judging. Per method, the grid sends:

- ``single``        each constraint alone (a batch of one) with the target ``lm_head`` zeroed,
                    so every logit is 0, the drafter agrees and drafts are accepted (draft rows
                    are checked, stop tokens land inside accepted drafts);
- ``mixed``         every constraint vLLM accepts, one request each, in one batch (lm_head
                    zeroed);
- ``mixed-natural`` the same batch on the model's own (random) weights: distinct logits, drafts
                    mostly rejected;
- ``mixed-scaled``  the same batch with the lm_heads times ``SCALE`` (1e5): the model's own
                    logits are about 1e-5, every row's log-softmax -log(VOCAB) to 1e-6, so
                    only here do (prompt) logprobs differ by value from row to row.

The cases (``case_kwargs``) are derived from method ``none``'s unconstrained greedy output on
the same lm_head (``zero``, ``natural``, ``scaled``), passed on to every method: e.g. the stop
string is the text of that output's first three tokens, which completes at output index 2 —
with drafts accepted, inside step 1's accepted drafts; the penalties are negative
(presence -0.5, frequency -0.3, repetition 1.5), so on the zeroed lm_head the target keeps the
drafter's token and drafts with earlier accepted drafts are checked (positive ones move the
target's argmax: no draft is ever accepted).

A cell is ``holds`` (every row and the output satisfy the contract), ``violated`` (the first
violating step and row, its local position and output index, the contract, and the stage the
evidence shows — ``rowjudge.STAGES``; host-side post-processing when every row held but the
final output breaks the contract), ``not judged`` (nothing broke, but the cell's own contract
could not be checked on this output: ``contracts.unjudged``'s reason — for a structured output,
no output token went through its grammar (the reasoning never ended within the output), or no
grammar evidence could be built (xgrammar missing, another backend) and the output ended by
length before its JSON was complete — never counted as held), ``refused`` (vLLM rejected the parameter for this method:
its message is the result), ``method refused`` (vLLM rejected the speculative method itself when
the engine was configured — e.g. MRV2 without ngram on 0.28–0.31: its message) or ``error`` (the request failed otherwise: the message). Each cell
also carries the differential: the first output index where the greedy output differs from
method ``none``'s for the same request, located to the spec run's step and row, with that row's
top-1/top-2 margin (a near tie is numerics, not a constraint). Prompt logprobs are the prompt's
whatever the method: a spec cell's must equal ``none``'s for the same request (rank by rank, to
the contracts' tolerance); a difference makes the ``prompt_logprobs`` cell ``violated`` at stage
``differential vs none`` (its rows are self-consistent: the hidden states themselves differ).
The stop-string and prompt-logprobs contracts are judged on the host
(``contracts.check_stop_strings`` on the returned tokens' decoded prefixes;
``contracts.check_prompt_logprobs``: vLLM's device values against the rows they came from —
``prompt row selection`` — then the user's values against the device's — ``host-side
post-processing``).

Structured outputs (``grammar_evidence``): the request's JSON schema compiled as vLLM's
xgrammar backend compiles it (``workbook.vllm.grammar``); the output through it from where vLLM
starts it (after the reasoning) — a valid prefix holds, the first rejected token is the breach —
and per row (draft rows included) the processed argmax and the number of finite columns
against what the grammar allows after the committed output + the row's drafts (stage
``grammar bitmask``). Cases: one per contract, plus ``structured_output+budget``
(``CASE_CONTRACTS``: thinking_token_budget 2 and the JSON schema: the grammar must start right
after the forced ``</think>``; with a prompt-lookup drafter the ``</think>`` and the first JSON
tokens are accepted within one step). The structured cases' prompts hold the grammar's greedy
continuation (``PROMPT_TEXT``) so ngram drafts it; the plain ``structured_output`` prompt ends
the reasoning (``NO_THINKING``), so the grammar binds from the first token.

The grid's files (``workbook.run.constraints.grid``): ``grid.json`` (cells, the version, the methods run),
``evidence/<method>/<batch>.json`` (per request: registration, every row's kept columns
raw/processed, breaches, the prompt-logprob rows). Bad constraint parameters fail before any
engine starts (``validate_case``). ``python -m workbook.run.constraints.cases`` is
``python -m workbook.run.constraints.grid``.

Not here: the contracts (``workbook.core.contracts``), the evidence hooks
(``workbook.hooks.observe.rowcheck``), the faults (``workbook.hooks.faults.constraints``), rendering
(``workbook.report.constraints``).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from workbook.core import contracts
from workbook.core.config import ConfigError, RunConfig
from workbook.run.constraints.caseparams import is_refusal, sampling_params  # noqa: F401  (re-exported)

from workbook.run.constraints.differential import (  # noqa: E402,F401 (re-exported)
    differential, emitted_at, evidence_key)
from workbook.run.constraints.grammar_rows import grammar_evidence  # noqa: E402,F401

METHODS = ("none", "mtp", "eagle", "ngram", "draft_model")
BATCHES = ("single", "mixed", "mixed-natural", "mixed-scaled")
SCALE = 1e5  # mixed-scaled: the lm_heads times this (request.scaled_lm_head)
# the grid's cases: one per contract, plus cases that combine contracts (their contracts:
# ``CASE_CONTRACTS``)
CONSTRAINTS = contracts.CASES
CASE_CONTRACTS = contracts.CASE_CONTRACTS
JSON_SCHEMA = contracts.JSON_SCHEMA
# What the JSON schema's grammar makes of the zeroed lm_head (every allowed column ties at 0;
# greedy takes the lowest id): the structured cases' prompts hold it, so a prompt-lookup
# drafter (ngram) drafts what the target emits, across the reasoning boundary for the budget
# case ("!" is the zeroed head's reasoning token, "</think>" the budget's forced end).
GRAMMAR_GREEDY = '{"a":-1000000000'
PROMPT_TEXT = {"structured_output": f"Say {GRAMMAR_GREEDY}.",
               "structured_output+budget": f"Say <think>\n!</think>{GRAMMAR_GREEDY}."}
# the prompt ends the reasoning (the chat template's enable_thinking=False): vLLM applies the
# grammar from the first output token
NO_THINKING = ("structured_output",)


def case_kwargs(name: str, baseline: list[int], decode) -> dict[str, Any]:
    """``SamplingParams`` keywords of constraint ``name``, derived from the unconstrained greedy
    output ``baseline`` (so each constraint binds: it masks, penalises or stops a token the
    model would emit); ``decode(ids) -> str`` for the string-valued ``bad_words``. Each
    contract's own (``contracts.case_kwargs``)."""
    return contracts.case_kwargs(name, baseline, decode)


def validate_case(name: str, kw: dict, vocab_size: int) -> None:
    """``contracts.validate`` on a case's keywords (bad words as strings: non-empty)."""
    if name not in CONSTRAINTS:
        raise ConfigError(f"constraint {name!r} is unknown; known: {list(CONSTRAINTS)}")
    d = dict(kw)
    words = d.pop("bad_words", None) or []
    if any(not isinstance(w, str) or not w.strip() for w in words):
        raise contracts.ContractError("bad_words", "entries must be non-empty strings")
    d.pop("structured_outputs", None)
    d["bad_words"] = [(0,)] * len(words)
    d.pop("include_stop_str_in_output", None)
    contracts.validate(contracts.Params.of(d), vocab_size)


@dataclass
class Cell:
    constraint: str
    method: str
    batch: str
    status: str  # holds | violated | not judged | refused | method refused | error | not run
    # | not available (an axis this workbook does not have yet: run.axes)
    message: str = ""
    first: dict | None = None  # step, row, local_pos, out_index, contract, stage, what
    breaches: int = 0
    rows: int = 0
    draft_rows: int = 0
    unreachable_rows: int = 0  # draft rows after a draft that breaks a forced column: not judged
    accepted_drafts: int = 0
    output: list = field(default_factory=list)
    finish_reason: str | None = None
    differential: dict | None = None
    kwargs: dict = field(default_factory=dict)  # the request's SamplingParams keywords
    grammar: dict | None = None  # structured outputs: contracts.GrammarTruth of the output
    prompt_logprobs: list | None = None  # returned, per prompt position: [[id, logprob], ...]
    # another request's constraint found on this request's rows (``rowjudge``): not a breach of
    # this cell's contracts
    affected_by: list = field(default_factory=list)
    axes: dict = field(default_factory=dict)  # the grid point: axis name -> value (run.grid)
    preemptions: int | None = None  # vLLM's Request.num_preemptions when freed (hooks.preempt)
    steered: int = 0  # draft rows whose proposals the drafter steer replaced (hooks.steer)
    unreached: list = field(default_factory=list)  # an axis value vLLM did not run (axes.verify)
    cached_tokens: int | None = None  # vLLM's RequestOutput.num_cached_tokens (prefix caching)
    samples: list = field(default_factory=list)  # n > 1: each output's request id and verdict
    invariance: dict | None = None  # vs the same cell at its axis value's reference (axes)
    # its own contracts held, its rows or output changed (by a neighbour, the slot's history or
    # a cause no contract explains): reported at its first changed row, never among the holds
    victim: bool = False
    alone: dict | None = None  # batch invariance: the request alone on a fresh slot vs in the batch

    def to_dict(self) -> dict:
        from workbook.run import verdicts

        d = asdict(self)
        d["verdict"] = verdicts.of_cell(d)  # the one verdict shape the report reads
        return d


def prompt_for(tokenizer, name: str) -> list[int]:
    """The case's chat prompt (``PROMPT_TEXT`` or "Say <name>."), thinking on except for
    ``NO_THINKING``."""
    text = PROMPT_TEXT.get(name, f"Say {name}.")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True,
                                        enable_thinking=name not in NO_THINKING)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def prompt_of(tokenizer, name: str, cfg=None) -> list[int]:
    """The case's prompt in the grid at ``cfg``'s point: ``prompt_for``, after the shared
    reasoning prefix when ``cfg.prompt_prefix`` asks for one (``axes.with_prefix``)."""
    from workbook.run.constraints import axes

    return axes.with_prefix(tokenizer, prompt_for(tokenizer, name),
                            int(getattr(cfg, "prompt_prefix", 0) or 0))


def run_batch(engine, cases: dict[str, dict], *, zero_head: bool, batch: str,
              fault: str | None = None, scale: float | None = None, cfg=None,
              steer_plans: dict[str, list[int]] | None = None, victim: dict | None = None
              ) -> tuple[dict[str, Cell], dict]:
    """Send ``cases`` (name -> SamplingParams keywords) as one batch on ``engine`` under the
    hooks of ``cfg`` (default: the grid's plain configuration) with the row check on and
    ``fault`` (a constraint fault; default ``cfg.constraint_fault``), installed and removed
    by the in-process backend (``workbook.hooks.install``, as for any run); ``zero_head``: the
    lm_heads zeroed, ``scale``: multiplied by it. Returns the cells (method filled by the
    caller) and the evidence, judged by ``workbook.run.constraints.rowjudge``. ``cfg.arrival``: how the
    requests reach the engine (``generate``); ``steer_plans`` (case -> token per output index,
    ``steer_plan``): the drafter's proposals replaced for those requests (``hooks.steer``);
    every request's preemptions are read from vLLM's own counter (``hooks.preempt``).
    The grid's request-level axes (``workbook.run.constraints.axes``): ``cfg.n`` outputs per
    request, each judged (``samples``); ``cfg.prompt_prefix`` (every prompt after one shared
    reasoning prefix, computed once before the batch so its blocks are cached);
    ``cfg.priority``; ``victim`` (keywords: a request aborted after step 2, ``cfg.abort``)."""
    from workbook import hooks
    from workbook.run import request as rq
    from workbook.run.backends import BACKENDS

    cfg = (cfg or RunConfig(trace=False, thinking_token_budget=-1)).replace(
        row_check=True, constraint_fault=fault or (cfg.constraint_fault if cfg else "none"))
    llm, tok = engine.llm, engine.tokenizer
    cells: dict[str, Cell] = {}
    prompts, sps, names = [], [], []
    for name, kw in cases.items():
        try:
            sps.append(sampling_params(kw, cfg.max_tokens, n=cfg.n,
                                       temperature=cfg.temperature if cfg.n > 1 else 0.0,
                                       seed=cfg.seed))
        except Exception as e:  # vLLM refused the parameter itself
            cells[name] = Cell(name, "", batch, "refused", _msg(e))
            continue
        prompts.append({"prompt_token_ids": prompt_of(tok, name, cfg)})
        names.append(name)
    evidence: dict = {}
    if not names:
        return cells, evidence
    head = rq.zeroed_lm_head(engine) if zero_head else rq.scaled_lm_head(engine, scale) \
        if scale else contextlib.nullcontext()
    backend = BACKENDS["in-process"](cfg, engine=engine)
    from workbook.hooks.observe import preempt
    from workbook.hooks.observe import steer as hsteer
    from workbook.run.constraints import axes

    plans = {tuple(prompts[names.index(n)]["prompt_token_ids"]): v
             for n, v in (steer_plans or {}).items() if n in names and v}
    if cfg.prompt_prefix:  # the shared prefix computed once, unobserved: its blocks cached
        llm.generate([{"prompt_token_ids": prompt_of(tok, "prefix", cfg)}],
                     sampling_params({}, 1), use_tqdm=False)
    with head:
        backend.start()
        pc = preempt.PreemptionCount().install()
        st = hsteer.Steer(engine.runner, plans).install() if plans else None
        try:
            rc = hooks.row_check(backend.hooks)
            if len(prompts) > 1:  # one refused request must not take its batch with it
                for i, e in sorted(axes.refusals(llm, prompts, sps).items(), reverse=True):
                    cells[names[i]] = Cell(names[i], "", batch, "refused", _msg(e))
                    del prompts[i], sps[i], names[i]
                if not names:
                    return cells, evidence
            filler = {"prompt_token_ids": prompt_of(tok, "nothing", cfg)} \
                if getattr(cfg, "arrival", "step0") == "staggered" and len(prompts) == 1 else None
            abort = None if victim is None else (
                {"prompt_token_ids": prompt_of(tok, "abort", cfg)},
                sampling_params(victim, cfg.max_tokens), 2)
            outs = axes.generate(llm, prompts, sps, getattr(cfg, "arrival", "step0"),
                                 filler=filler, abort=abort,
                                 priorities=axes.priorities(len(prompts), cfg.priority))
        except Exception as e:
            msg = _msg(e)
            status = "refused" if _is_refusal(e) else "error"
            for n in names:
                cells[n] = Cell(n, "", batch, status, msg)
            return cells, {"error": msg}
        finally:
            if st is not None:
                st.remove()
            pc.remove()
            backend.stop()
    judge_batch(rc, names, outs, cases, batch, engine, tok, sps, cells, evidence)
    for name, o in zip(names, outs):
        cells[name].cached_tokens = getattr(o, "num_cached_tokens", None)
    mode = getattr(cfg, "invariance", "off")
    if mode == "on" or mode == "auto" and any(  # a cause in the batch or the slot's history
            (cells[n].first or {}).get("source") in ("unexplained", "neighbour") for n in names):
        from workbook.run.constraints import invariance  # the reference a defect cannot share

        invariance.check(engine, cfg, cases, names, cells, evidence, zero_head=zero_head,
                         scale=scale, batch=batch, everyone=mode == "on", send=run_batch)
    for name in names:
        cells[name].preemptions = pc.of(prompt_of(tok, name, cfg))
        if cells[name].status == "error" and cells[name].preemptions:
            cells[name].message += (f" (vLLM preempted it {cells[name].preemptions} time(s); "
                                     "its rows were not observed)")
        if st is not None:
            cells[name].steered = st.of(prompt_of(tok, name, cfg))
            if st.errors:
                cells[name].message = "; ".join(x for x in (cells[name].message,
                                                             *st.errors[:2]) if x)
    return cells, evidence


def judge_batch(rc, names: list[str], outs: list, cases: dict, batch: str, engine, tok, sps,
                cells: dict, evidence: dict) -> None:
    """One batch's cells and evidence (into ``cells`` / ``evidence``) from the row check's
    evidence ``rc`` (a ``RowCheck``, or the served grid's reader of the same records) and the
    finished outputs ``outs`` (``RequestOutput``-shaped), matched by prompt: ``rowjudge`` over
    the rows, ``judge_request`` per request. The in-process and the served grid both judge
    here."""
    from workbook.run.constraints import rowjudge

    from workbook.run.constraints import samples

    reqs = samples.request_ids(rc, outs)  # per output, per sample: the engine's request id
    labels = {r: n for n, rs in zip(names, reqs) for r in rs if r is not None}
    verdicts = rowjudge.judge(rc, {r: f"{r} ({n})" for r, n in labels.items()})
    for name, o, rs in zip(names, outs, reqs):
        got = []
        for i, req in enumerate(rs):
            got.append(judge_request(name, batch, samples.view(o, i), rc, req,
                                     verdicts.get(req), engine, tok=tok,
                                     sp=sps[names.index(name)]))
            if i:  # the other samples' evidence beside the first's
                evidence[samples.key(name, i)] = samples.evidence(rc, req, verdicts.get(req))
        req = rs[0]
        cells[name] = samples.pick(got, rs)
        cells[name].kwargs = _jsonable(cases[name])
        evidence[name] = samples.evidence(rc, req, verdicts.get(req))


def judge_request(name: str, batch: str, o, rc, req: str | None, verdict: dict | None,
                  engine=None, tok=None, sp=None) -> Cell:
    """The cell of one request: the row breaches (the grammar's over the rows too, for a
    structured output on ``engine``), then the output contract on what the user got
    (host-side post-processing when the rows held); the stop strings on the returned tokens'
    decoded prefixes (``tok``, the request's ``skip_special_tokens``); the prompt logprobs
    against the rows they came from, then the host's values against those rows."""
    comp = o.outputs[0]
    output = [int(t) for t in comp.token_ids]
    cell = Cell(name, "", batch, "holds", output=output, finish_reason=comp.finish_reason)
    if req is None or verdict is None:
        cell.status, cell.message = "error", "no row evidence for this request"
        if sp is not None and getattr(sp, "prompt_logprobs", None) is not None:
            plp = _host_prompt_logprobs(o)  # what the user got stays on record (differential)
            cell.prompt_logprobs = None if plp is None else \
                [None if d is None else [[t, v] for t, v in d.items()] for d in plp]
        return cell
    cell.rows, cell.draft_rows = verdict["rows"], verdict["draft_rows"]
    cell.unreachable_rows = verdict.get("unreachable_rows", 0)
    cell.affected_by = list(verdict.get("affected_by") or [])
    emitted = rc.emitted_rows(req)
    cell.accepted_drafts = sum(1 for e in emitted if e["local_pos"] and e["local_pos"] > 0)
    p = rc.params[req]
    grammar, no_grammar, grammar_bound_rows = grammar_evidence(engine, rc, req, output)
    cell.grammar = grammar.to_dict() if grammar is not None else None
    row_breaches = sorted(list(verdict["breaches"]) + grammar_bound_rows, key=_where)
    breaches = list(row_breaches)
    breaches += _logprob_rows(p, emitted)
    returned, truth = _returned_logprobs(comp, output, emitted)
    out_b = contracts.check_output(p, rc.prompts[req], output, comp.finish_reason, rc.markers,
                                   text=comp.text, logprobs=returned, logprob_truth=truth,
                                   grammar=grammar)
    stream = [e["emitted_token"] for e in emitted]
    for b in out_b:
        at = emitted[b.out_index] if b.out_index is not None and b.out_index < len(emitted) \
            else (emitted[-1] if emitted else {})
        breaches.append({"step": at.get("step"), "row": at.get("row"),
                         "local_pos": at.get("local_pos"),
                         "stage": "host-side post-processing" if not row_breaches
                         and output != stream[:len(output)] or (not row_breaches and
                                                               b.contract == "stop")
                         else (row_breaches[0]["stage"] if row_breaches
                               else "host-side post-processing"), **b.to_dict()})
    texts = None
    if p.stop_strings and tok is not None:
        skip = bool(getattr(sp, "skip_special_tokens", True))
        texts = [tok.decode(output[:i + 1], skip_special_tokens=skip)
                 for i in range(len(output))]
        for b in contracts.check_stop_strings(p, output, comp.text, texts, comp.finish_reason):
            at = emitted[b.out_index] if b.out_index is not None and b.out_index < len(emitted) \
                else (emitted[-1] if emitted else {})
            breaches.append({"step": at.get("step"), "row": at.get("row"),
                             "local_pos": at.get("local_pos"),
                             "stage": "host-side post-processing", **b.to_dict()})
    host_plp = _host_prompt_logprobs(o)
    if p.prompt_logprobs is not None:
        cell.prompt_logprobs = None if host_plp is None else \
            [None if d is None else [[t, v] for t, v in d.items()] for d in host_plp]
        breaches += _prompt_logprob_breaches(rc.prompts[req], host_plp, rc.prompt_rows(req))
    breaches.sort(key=_where)
    cell.breaches = len(breaches)
    if breaches:
        cell.status, cell.first = "violated", dict(breaches[0])
        cell.victim = bool(verdict.get("victim")) and all(
            b.get("source") not in (None, "own") for b in breaches)
        c = cell.first.get("column")
        if cell.first.get("source") == "unexplained" and c is not None and output:
            k = sum(1 for t in output if t == c)
            cell.first["what"] += (f"; its output holds {c} at {k} of its {len(output)} "
                                   "token(s)" + (" (all of them)" if k == len(output) else ""))
    if verdict.get("registration"):
        cell.message = "; ".join(x for x in (cell.message, verdict["registration"]) if x)
    else:
        unj = {**contracts.unjudged(p, output, comp.finish_reason, comp.text, grammar=grammar,
                                    no_grammar=no_grammar),
               **contracts.unjudged_host(p, texts, host_plp)}
        why = next((unj[c] for c in CASE_CONTRACTS.get(name, (name,)) if c in unj), None)
        if why:  # the cell's own contract was never checked: not "holds"
            cell.status, cell.message = "not judged", why
    if rc.errors:
        cell.message = "; ".join(rc.errors[:3])
    if p.prompt_logprobs is not None and host_plp is not None and not rc.prompt_rows(req):
        cell.message = "; ".join(x for x in (cell.message, "no prompt-logprob rows recorded: "
                                             "judged on the returned values and by the "
                                             "differential only") if x)
    return cell


def _where(b: dict) -> tuple:
    return (b["step"] if b.get("step") is not None else 1 << 30,
            b["row"] if b.get("row") is not None else 1 << 30)


def _host_prompt_logprobs(o) -> list[dict | None] | None:
    """``RequestOutput.prompt_logprobs`` as ``[{id: logprob} | None]``."""
    pl = getattr(o, "prompt_logprobs", None)
    if pl is None:
        return None
    return [None if d is None else {int(t): float(getattr(v, "logprob", v)) for t, v in d.items()}
            for d in pl]


def _prompt_logprob_breaches(prompt: list[int], host: list | None, rows: dict) -> list[dict]:
    """The prompt-logprobs contract: vLLM's device values per position against the row they
    came from (``prompt row selection``), then what the user got against those device values
    (``host-side post-processing``)."""
    if host is None:
        return []
    n = len(prompt)
    dev = [None] * n
    truth = [None] * n
    inputs = [None] * n
    for q, r in rows.items():
        if q < n:
            dev[q] = dict(zip(r["ids"], r["vals"]))
            truth[q] = dict(zip(r["ids"], r["truth"]))
            inputs[q] = r["input"]
    out = []
    checks = [(dev, truth, inputs, "prompt row selection"), (host, dev, None,
                                                           "host-side post-processing")]
    for got, want, ins, stage in checks if rows else checks[1:2]:
        for q, b in contracts.check_prompt_logprobs(prompt, got, want, ins):
            if stage == "prompt row selection" and q is not None and got[q] is None:
                b = contracts.Breach("prompt_logprobs", f"position {q}: the row check recorded "
                                     "no row for it (vLLM returned no prompt logprobs there)")
            r = rows.get(q, {}) if q is not None else {}
            out.append({"step": r.get("step"), "row": r.get("row"), "local_pos": None,
                        "stage": stage, "position": q, **b.to_dict()})
        if out:
            break
    return out




def _logprob_rows(p, emitted: list[dict]) -> list[dict]:
    """Each emitted row's returned logprobs — the sampled token (column 0) and every top-k
    column — vs its own row (``logprob_truth``: the row's value per ``logprobs_mode``)."""
    if p.logprobs is None:
        return []
    out = []
    for e in emitted:
        ids, got, want = e.get("logprob_ids"), e.get("logprobs"), e.get("logprob_truth")
        if not ids:
            continue
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if not contracts.close(g, w)]
        if ids[0] != e["emitted_token"] or bad:
            i = bad[0] if bad else 0
            out.append({"step": e["step"], "row": e["row"], "local_pos": e["local_pos"],
                        "stage": "logprob row selection", "contract": "logprobs",
                        "what": f"row {e['row']} returns {got[i]:.6g} for token {ids[i]} "
                                f"(sampled {e['emitted_token']}); its own row says "
                                f"is {want[i]:.6g}",
                        "column": ids[i], "out_index": None})
            break
    return out


def _returned_logprobs(comp, output, emitted):
    if comp.logprobs is None:
        return None, None
    returned = []
    for i, d in enumerate(comp.logprobs):
        lp = d.get(output[i]) if i < len(output) else None
        returned.append(None if lp is None else float(lp.logprob))
    truth = [e["logprob_truth"][0] if e.get("logprob_truth") and e["emitted_token"] == t
             else None for e, t in zip(emitted, output)]
    return returned, truth


class MethodRefused(Exception):
    """vLLM refused the speculative method itself when the engine was configured (e.g. "Model
    Runner V2 does not yet support ..."): every cell of the method is ``method refused``."""


def one_line(e: Exception) -> str:
    """The exception as one line: every line of its message (pydantic puts the reason on the
    second one), without pydantic's ``[type=..., input_value=...]`` echo and its links."""
    lines = [ln.split(" [type=")[0].strip() for ln in str(e).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("For further information")]
    return f"{type(e).__name__}: {' — '.join(lines)}"[:400]


_is_refusal, _msg = is_refusal, one_line  # the names run_batch / judge_request use


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))


def reproducer(cell: dict, grid: dict) -> str:
    """A few lines that send the violating request again (in-process, the tiny model)."""
    kw = cell.get("kwargs") or {}
    head = {"single": "rq.zeroed_lm_head(eng)", "mixed": "rq.zeroed_lm_head(eng)",
            "mixed-scaled": f"rq.scaled_lm_head(eng, {SCALE:g})"}.get(cell.get("batch"),
                                                                      "contextlib.nullcontext()")
    return (f"# vLLM {grid.get('vllm_version')}: {cell['constraint']} with {cell['method']}, "
            f"batch {cell.get('batch')} (sent alone here)\n"
            f"import contextlib\n"
            f"from workbook.run import request as rq; from workbook.run.constraints import cases as C; from workbook.run.constraints import grid as G\n"
            f"from workbook.vllm import engine as E\n"
            f"eng = E.start(G.config_for({cell['method']!r}))\n"
            f"sp = C.sampling_params({kw!r})\n"
            f"with {head}:\n"
            f"    out = eng.llm.generate([{{'prompt_token_ids': C.prompt_for(eng.tokenizer, "
            f"{cell['constraint']!r})}}], sp)\n"
            f"print(out[0].outputs[0].token_ids, repr(out[0].outputs[0].text))  "
            f"# found: {cell['first'] and cell['first']['what']}")


if __name__ == "__main__":  # python -m workbook.run.constraints.cases: the grid's command
    import runpy

    runpy.run_module("workbook.run.constraints.grid", run_name="__main__", alter_sys=True)
