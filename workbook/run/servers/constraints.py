"""``workbook check-server --constraints``: every per-request constraint of the contract family
sent to a running server through its OpenAI endpoint, and judged on what the server returns.

Installs nothing; the server is any ``vllm serve`` (``workbook serve`` starts one). Processing
order (``check_constraints``):

1. the model, the server's reasoning markers and its logprobs mode (``workbook.run.servers.check``);
2. the baseline: the unconstrained greedy output of the grid's baseline prompt
   (``constraints.prompt_for``'s text, ``"Say nothing."``) — the cases are derived from it
   exactly as the constraints grid derives them (``contracts.case_kwargs``);
3. per case (``contracts.CASES``, or the ones ``--constraints`` names): the case's prompt
   through the server's chat template (``POST /tokenize`` with ``messages``), then
   ``POST /v1/completions`` on those prompt ids with the case's parameters, greedy,
   ``ignore_eos`` (as the grid sends them), ``return_token_ids`` and ``logprobs``; the same
   prompt once more without the constraint (the control);
4. the verdict per case, from what the server returned, by the contracts' own output checks
   (``contracts.check_output``, ``check_stop_strings`` on the returned tokens' decoded prefixes
   from ``POST /detokenize``, ``check_prompt_logprobs``; for a JSON schema the returned tokens
   through the request's grammar, ``grammar_evidence``: xgrammar on the tokenizer of the folder
   the server loaded, once the server's ``/tokenize`` agrees with it) and, where the logprobs
   mode shows the processed row, every column the case returned (``row_breaches``) against
   ``contracts.expected`` of the control's value at the same output index and the same output
   prefix (``aligned_control``: one-token requests past where the control's greedy output
   leaves the case's), a column the grammar disallows as masked: in ``processed_logits``
   directly; in ``processed_logprobs`` up to the row's log-softmax shift (the median over the
   columns no contract changes), so only additive contracts — the penalties' frequency and
   presence are judged on the case sent once more without the repetition penalty, which is
   not additive and is said not judged; in raw mode nothing of the rows is visible.

Per case: ``holds`` (every check it could make passed, and at least one check of its own
contract ran), ``violated`` (the first breach: the output index, the contract, what was seen),
``not judged`` (why: the contract's own ``unjudged`` reason, or what the endpoint cannot show),
``refused`` (the server rejected the parameters: vLLM's message; the server's setting, not a
defect) or ``wrong setting`` (the reasoning markers given are not the server's:
``servercheck.marker_mismatch``). What is judged host-side only: no draft rows, no rejected
tokens, no step, no stage — the hooked run (``workbook run constraints``) has those.

Not here: the requests and what they return, the same-prefix control and the grammar evidence
(``workbook.run.servers.requests``; re-exported here), the contracts (``workbook.core.contracts``),
the budget's per-position forcing
(``servercheck.judge_positions``, reused for the budget's cases), starting a server.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from workbook.core import budget, contracts
from workbook.core.budget import Markers
from workbook.core.contracts import Params, RowContext
from workbook.run.constraints import cases as C
from workbook.run.servers import check as sc
from workbook.run.serverapi import completion_body
from workbook.run.servers.requests import (CONTROL_CONCURRENCY, GRAMMAR_PROBE,  # noqa: F401
                                         Sent, aligned_control, bad_word_ids, grammar_evidence,
                                         model_root, prompt_ids, send)

MAX_TOKENS = 16  # the grid's
ROW_LOGPROBS = 20  # vLLM's default --max-logprobs
HOST_ATOL = 1e-3  # two requests' rows (not one row twice): float32 batch-shape differences
HOST_RTOL = 1e-4
ROW_CONTRACTS_NOTE = ("a row contract: the returned output cannot show it, and the logprobs "
                      "mode shows no processed row")
REPETITION_NOT_ADDITIVE = ("the repetition penalty is not additive in log-probabilities (it "
                           "scales logits: the server's --logprobs-mode processed_logits shows "
                           "it); frequency and presence are judged on the same request without "
                           "it")


class UnknownConstraint(sc.ServerCheckError):
    """A constraint name that is not a case of the family (a wrong setting, exit 2)."""


def parse_names(spec: str | None) -> list[str]:
    """``--constraints``: ``all`` / empty → every case; else comma-separated case names."""
    if not spec or spec.strip() == "all":
        return list(C.CONSTRAINTS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in C.CONSTRAINTS]
    if bad:
        raise UnknownConstraint(f"--constraints: {', '.join(map(repr, bad))} unknown; known: "
                                f"all, {', '.join(C.CONSTRAINTS)}")
    return [n for n in C.CONSTRAINTS if n in names]  # catalogue order


# --- judging ----------------------------------------------------------------------------------

@dataclass
class Verdict:
    case: str
    status: str  # holds | violated | not judged | refused | wrong setting | error
    message: str = ""
    first: dict | None = None  # contract, what, column, out_index
    breaches: int = 0
    judged: list = field(default_factory=list)  # the checks that ran
    not_judged: dict = field(default_factory=dict)  # contract -> why
    kwargs: dict = field(default_factory=dict)
    output: list = field(default_factory=list)
    finish_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _params(kw: dict, bad_words_ids: list[tuple[int, ...]], mode: str) -> Params:
    d = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **kw}
    d.pop("structured_outputs", None)
    schema = (kw.get("structured_outputs") or {}).get("json")
    d["bad_words"] = bad_words_ids
    p = Params.of(d, logprobs_mode={"raw": "raw_logprobs"}.get(mode, mode))
    return p if schema is None else Params(**{**asdict(p), "json_schema": schema})


def row_breaches(p: Params, case: Sent, control: Sent, markers: Markers,
                 mode: str, allowed: Callable[[int], Any] | None = None,
                 stats: dict | None = None) -> tuple[list[contracts.Breach], str | None]:
    """The processed rows the logprobs show, at the columns both requests returned, against
    ``contracts.expected`` of the control's value (same prompt and same output prefix: the
    same raw row). ``allowed(i)``: what the request's grammar allows at output index ``i``
    (a bool array over the vocabulary; None where no grammar binds: ``grammar_evidence``) — a
    column it disallows must be masked (-inf) by the grammar bitmask, which no control shows.
    Returns the breaches and, when rows could not be judged, why; ``stats`` (if given) gets
    the number of positions and columns compared."""
    if mode == "raw":
        return [], "the server returns raw logprobs: no processed row is visible"
    if mode == "processed_logprobs" and p.repetition_penalty != 1.0:
        return [], REPETITION_NOT_ADDITIVE.split(";")[0]
    out: list[contracts.Breach] = []
    compared, seen_at = 0, set()
    n = min(len(case.output), len(control.output), len(case.tops), len(control.tops))
    for i in range(n + 1):
        if i >= len(case.tops) or i >= len(control.tops):
            break
        if case.output[:i] != control.output[:i]:
            break  # another prefix: another raw row
        ctx = RowContext(tuple(case.prompt), tuple(case.output[:i]), markers=markers)
        got, raw = case.tops[i], control.tops[i]
        cols = [c for c in got if c in raw]
        exp = {c: contracts.expected(p, ctx, c, raw[c]) for c in cols}
        mask = allowed(i) if allowed is not None else None
        if mask is not None:
            exp = {c: e if 0 <= c < len(mask) and mask[c] else
                   contracts.Expect(contracts.NEG_INF, False, e.by + ("structured_output",))
                   for c, e in exp.items()}
        if any(e.forced for e in exp.values()):
            continue  # the budget's forced column: judged per position by judge_positions
        shift, plain = 0.0, []
        if mode == "processed_logprobs":
            # the log-softmax's constant: the same for every column, estimated as the median
            # shift of the columns no contract changes (one broken column stays an outlier)
            plain = [c for c in cols if not exp[c].by and got[c] > sc.CLAMP + 1]
            if not plain:
                continue
            shift = statistics.median(got[c] - raw[c] for c in plain)
        for c in cols:
            e, g = exp[c], got[c]
            want = e.value + shift
            if e.value == contracts.NEG_INF:
                ok = g <= sc.CLAMP + 1
            elif g <= sc.CLAMP + 1:
                ok = False
            else:
                ok = abs(g - want) <= HOST_ATOL + HOST_RTOL * abs(want)
            compared += 1
            seen_at.add(i)
            if not ok:
                masked = e.value == contracts.NEG_INF
                by = " via " + ", ".join(e.by) if e.by else " (unchanged)"
                lse = (f" and the row's log-softmax shift {shift:+.6g} (the median over the "
                       f"{len(plain)} columns no contract changes)") if plain and not masked \
                    else ""
                what = (f"column {c} at output index {i}: expected "
                        f"{'-inf (masked)' if masked else f'{want:.6g}'} from the control's "
                        f"{raw[c]:.6g}{by}{lse}, found {g:.6g}")
                out.append(contracts.Breach(e.by[-1] if e.by else contracts.row_owner(p),
                                            what, c, i))
                break
        if out:
            break
    if stats is not None:
        stats.update(positions=len(seen_at), columns=compared)
    if not compared and not out:
        return [], "no column the contracts name came back in both requests' logprobs"
    return out, None


def judge(name: str, kw: dict, p: Params, case: Sent, control: Sent | None, markers: Markers,
          mode: str, texts: list[str] | None, *, grammar: contracts.GrammarTruth | None = None,
          no_grammar: str | None = None, rows: tuple[Params, Sent] | None = None,
          rows_note: dict | None = None, allowed: Callable[[int], Any] | None = None
          ) -> Verdict:
    """One case's verdict from what the server returned. ``grammar``: the output through the
    request's grammar (``grammar_evidence``; ``no_grammar``: why there is none); ``rows``: the
    (parameters, request) whose processed rows are judged against ``control`` when not the
    case's own (the penalties without the repetition penalty in processed_logprobs);
    ``rows_note``: what of the case those rows leave unjudged (parameter -> why); ``allowed``:
    the grammar's mask per output index (``row_breaches``)."""
    v = Verdict(name, "holds", kwargs=json.loads(json.dumps(kw, default=str)),
                output=case.output, finish_reason=case.finish_reason)
    own = C.CASE_CONTRACTS.get(name, (name,))
    want_lp = p.logprobs is not None
    br = contracts.check_output(p, case.prompt, case.output, case.finish_reason, markers,
                                text=case.text, logprobs=case.logprobs if want_lp else None,
                                grammar=grammar)
    host = contracts.Outcome(prompt=case.prompt, output=case.output, texts=texts,
                             prompt_logprobs=case.prompt_logprobs, text=case.text,
                             finish_reason=case.finish_reason)
    for c in contracts.catalogue():
        if c.active(p) and c.host_evidence:
            br += c.check_output(p, host)
    v.not_judged = {**contracts.unjudged(p, case.output, case.finish_reason, case.text,
                                         grammar=grammar,
                                         no_grammar=no_grammar or "the grammar is the server's; "
                                         "its endpoint returns no grammar state"),
                    **contracts.unjudged_host(p, texts, case.prompt_logprobs)}
    v.judged.append("output")
    if grammar is not None:
        v.judged.append("the output through the grammar (xgrammar, the model's tokenizer)")
    if p.thinking_token_budget is not None:
        pos = sc.judge_positions(case.prompt, case.output, case.tops, p.thinking_token_budget,
                                 markers, mode)
        v.judged.append(f"the budget per position ({mode})")
        bad = [q for q in pos["positions"] if not q["ok"]]
        if p.json_schema is not None or p.allowed_token_ids is not None:
            # a row the grammar or the mask leaves one column looks forced in processed
            # logprobs: only a due position is the budget's evidence there
            bad = [q for q in bad if q["due"] is not None]
        fb = bad[0] if bad else None
        if fb is not None:
            br.append(contracts.Breach("thinking_token_budget", fb["status"], fb.get("forced"),
                                       fb["index"]))
    rows_why = "no control request (no column to compare)"
    if control is not None:
        rp, rcase = rows or (p, case)
        stats: dict = {}
        rb, rows_why = row_breaches(rp, rcase, control, markers, mode, allowed, stats)
        br += rb
        if rows_why is None:
            v.judged.append(f"processed rows vs the control ({mode}: {stats['columns']} "
                            f"columns at {stats['positions']} positions)")
            v.not_judged.update(rows_note or {})
    if p.logprobs is not None:
        v.not_judged["logprobs"] = ("the count is judged; each value against its own row "
                                    "needs the row evidence of a hooked run")
    for c in own:
        k = contracts.get(c)
        if k.step is not None and not _has_output_check(k) and rows_why is not None:
            v.not_judged[c] = f"{ROW_CONTRACTS_NOTE} ({rows_why})"
    v.not_judged = {k: w for k, w in v.not_judged.items() if w}
    br.sort(key=lambda b: (b.out_index if b.out_index is not None else 1 << 30))
    v.breaches = len(br)
    if br:
        v.status, v.first = "violated", br[0].to_dict()
    elif all(c in v.not_judged and c != "logprobs" for c in own):
        v.status = "not judged"
        v.message = "; ".join(f"{c}: {v.not_judged[c]}" for c in own)
    return v


def _has_output_check(c: contracts.Contract) -> bool:
    return type(c).check_output is not contracts.Contract.check_output


def _is_refusal(e: sc.ServerCheckError) -> bool:
    return bool(re.search(r"HTTP 4\d\d", str(e)))


# --- the whole check --------------------------------------------------------------------------

@dataclass
class Result:
    url: str
    model: str
    mode: str
    mode_evidence: dict
    markers: dict
    baseline: list
    verdicts: list
    texts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def rc(self) -> int:
        """0 every case held or was not judged, 1 a violation, 2 a wrong setting only."""
        st = {v["status"] for v in self.verdicts}
        return 1 if "violated" in st else 2 if "wrong setting" in st else \
            3 if "error" in st else 0


def check_constraints(url: str, model: str | None = None, names: Sequence[str] | None = None,
                      *, mode: str = "auto", markers: Markers | None = None,
                      timeout: float = sc.TIMEOUT_S, api_key: str | None = None,
                      max_tokens: int = MAX_TOKENS, progress=None) -> Result:
    """Every case of ``names`` through the server's /v1/completions, judged host-side.
    ``progress`` (``workbook.core.progress.Progress`` over the cases): the set-up steps
    (markers, logprobs mode, baseline) and each case's request, a line per case as it is
    judged."""
    def step(text):
        if progress is not None:
            progress.step(text)

    if mode not in sc.MODES:
        raise sc.ServerCheckError(f"mode={mode!r} is unknown; choose one of {sc.MODES}")
    names = list(names or C.CONSTRAINTS)
    ep = sc.Endpoint(url, timeout, api_key)
    step("the served model and its markers")
    model = sc.served_model(ep, model)
    try:
        own = sc.server_markers(ep, model, sc.START_TEXT, sc.END_TEXT)
    except sc.ServerCheckError:
        own = None
    given = Markers.of(markers) if markers is not None and Markers.of(markers).complete \
        else None
    use = given or own or Markers()
    evidence: dict = {}
    if mode == "auto":
        step("the server's logprobs mode (a two-request temperature control)")
        mode, evidence = sc.infer_mode(ep, model, sc.Request())
        evidence["from"] = "temperature control (two one-token requests, no budget)"
        if mode == "unknown":
            mode, evidence["note"] = "raw", "the control could not tell the mode (flat logits)"
    step("the unconstrained baseline")
    base_prompt = prompt_ids(ep, model, "nothing")
    baseline = send(ep, completion_body(model, base_prompt, {}, max_tokens=max_tokens,
                                        logprobs=0)).output
    decode_cache: dict[tuple, str] = {}

    def decode(ids):
        key = tuple(int(t) for t in ids)
        if key not in decode_cache:
            decode_cache[key] = ep.post("/detokenize", {"model": model,
                                                        "tokens": list(key)}).get("prompt", "")
        return decode_cache[key]

    verdicts = []
    for i, name in enumerate(names):
        step(f"{name} ({i + 1}/{len(names)}): case, control and judging")
        kw = C.case_kwargs(name, baseline, decode)
        try:
            verdicts.append(_one(ep, model, name, kw, use, given, own, mode, decode,
                                 max_tokens, baseline))
        except sc.ServerCheckError as e:
            if not _is_refusal(e):
                raise
            verdicts.append(Verdict(name, "refused", str(e).split(": ", 1)[-1],
                                    kwargs=json.loads(json.dumps(kw, default=str))))
        if progress is not None:
            progress.done(f"{name}: {verdicts[-1].status}")
    return Result(ep.base, model, mode, evidence, use.to_dict(), baseline,
                  [v.to_dict() for v in verdicts])


def columns(p: Params, markers: Markers, prompt: Sequence[int], baseline: Sequence[int]
            ) -> list[int]:
    """The columns the case's rows change: the contracts' own (``Params.columns``), for
    penalties the prompt's last and the baseline's first tokens (a control request is sent
    when there is any), and two reference columns no contract names."""
    cols = list(p.columns(markers if markers.complete else None))
    if p.penalised:
        cols += list(prompt[-6:]) + list(baseline[:6])
    if not cols:
        return []
    named = set(cols) | set(p.masked_by_min_tokens) | {t for w in p.bad_words for t in w}
    cols += [t for t in range(9, 200) if t not in named][:2]
    return list(dict.fromkeys(int(t) for t in cols))[:sc.TOP_LOGPROBS * 4]


def _one(ep, model, name, kw, markers, given, own, mode, decode, max_tokens, baseline
         ) -> Verdict:
    prompt = prompt_ids(ep, model, name)
    words = kw.get("bad_words") or []
    p = _params(kw, bad_word_ids(ep, model, words) if words else [], mode)
    cols = columns(p, markers, prompt, baseline)
    # natural top-k at the server's default --max-logprobs: vLLM 0.32 with MTP answers HTTP 500
    # to logprob_token_ids past the first output token (docs/server-check.md)
    k = max(ROW_LOGPROBS, int(kw.get("logprobs") or 0))
    failed = None
    try:
        case = send(ep, completion_body(model, prompt, kw, max_tokens=max_tokens, logprobs=k))
    except sc.ServerCheckError as e:
        if "HTTP 5" not in str(e):
            raise
        # the server failed building the logprobs (e.g. an emitted token its sampler never
        # scored: KeyError in vLLM's completion logprobs): the tokens without logprobs
        failed = str(e).split(": ", 1)[-1]
        body = completion_body(model, prompt, {a: b for a, b in kw.items() if a != "logprobs"},
                               max_tokens=max_tokens,
                               logprobs=0)
        body.pop("logprobs")
        case = send(ep, body)
    rows, rows_note = None, None
    if mode == "processed_logprobs" and p.repetition_penalty != 1.0:
        # the additive penalties on the same prompt without the repetition penalty
        add = {a: b for a, b in kw.items() if a != "repetition_penalty"}
        rows_note = {"repetition_penalty": REPETITION_NOT_ADDITIVE.split(";")[0]}
        if p.frequency_penalty or p.presence_penalty:
            rows = (_params(add, p.bad_words, mode),
                    send(ep, completion_body(model, prompt, add, max_tokens=max_tokens,
                                             logprobs=k)))
    control = None
    if (cols or p.json_schema is not None) and mode != "raw" and not failed:
        control = aligned_control(ep, model, (rows or (p, case))[1], k, max_tokens)
    grammar, no_grammar, allowed = grammar_evidence(ep, model, p, case, markers)
    if p.thinking_token_budget is not None and given is not None and own is not None:
        found = sc.marker_mismatch(given, own, case.prompt, case.output, case.tops, mode)
        if found and found["evidence"] != "neither":
            texts = {t: decode([t]) for t in set(own.start) | set(own.end)
                     | {found.get("column", own.end[0])}}
            return Verdict(name, "wrong setting", sc.mismatch_line(given, own, found, texts),
                           kwargs=json.loads(json.dumps(kw, default=str)), output=case.output,
                           finish_reason=case.finish_reason)
    texts = [decode(case.output[:i + 1]) for i in range(len(case.output))] \
        if p.stop_strings else None
    v = judge(name, kw, p, case, control, markers, mode if not failed else "raw", texts,
              grammar=grammar, no_grammar=no_grammar, rows=rows, rows_note=rows_note,
              allowed=allowed)
    if failed:
        v.message = "; ".join(x for x in (v.message, f"with logprobs the server failed the "
                                          f"request ({failed}); judged on the tokens of the "
                                          "same request without logprobs") if x)
    return v


# --- text -------------------------------------------------------------------------------------

def render(res: Result) -> str:
    lines = [f"server {res.url}  model {res.model}",
             f"logprobs mode: {res.mode} ({res.mode_evidence.get('from', 'given')}); reasoning "
             f"markers used: start {sc.ids_text(res.markers.get('start'))} end "
             f"{sc.ids_text(res.markers.get('end'))}; baseline (unconstrained greedy) "
             f"{' '.join(map(str, res.baseline)) or 'empty'}",
             "", f"{'constraint':<26} {'verdict':<14} detail"]
    for v in res.verdicts:
        if v["status"] == "violated":
            f = v["first"]
            at = "" if f.get("out_index") is None else f" at output index {f['out_index']}"
            detail = f"{f['contract']}{at}: {f['what']}" + (f" ({v['message']})"
                                                             if v["message"] else "")
        elif v["status"] in ("refused", "wrong setting", "error", "not judged"):
            detail = v["message"]
        elif v["message"]:
            detail = "judged on: " + ", ".join(v["judged"]) + f" ({v['message']})"
        else:
            detail = "judged on: " + ", ".join(v["judged"])
        lines.append(f"{v['case']:<26} {v['status'].upper():<14} {detail}")
        if v["status"] in ("holds", "violated"):
            for c, why in v["not_judged"].items():
                lines.append(f"{'':<26} {'':<14} not judged here: {c}: {why}")
    st = [v["status"] for v in res.verdicts]
    counts = ", ".join(f"{st.count(s)} {s}" for s in dict.fromkeys(st))
    lines += ["", f"VERDICT: {counts} of {len(st)} constraint cases",
              "refused: the server rejected the parameters (its own validation, e.g. "
              "--max-logprobs or a missing reasoning parser): its setting, not a defect"
              if "refused" in st else None,
              "Judged host-side from the endpoint: the returned tokens, text, finish reason, "
              "logprobs and prompt logprobs; a JSON schema's output through its grammar; with "
              "processed logprobs or logits every returned column, against the same prompt and "
              "output prefix without the constraint. Not visible from a "
              "server: draft rows, rejected tokens, steps and stages (workbook run "
              "constraints has them)."]
    return "\n".join(x for x in lines if x is not None)
