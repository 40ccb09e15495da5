"""Check a running vLLM server's thinking budget from its OpenAI endpoint alone (installs nothing).

The first thing to run against a live server that cannot be restarted with the workbook's
plugin (``workbook check-server URL``). It sends the reported request and judges, position by
position, whether ``</think>`` was forced where the budget puts it.

Processing order (``check``):

1. ``GET /v1/models``: the model to ask (the one named, else the only / first one served);
2. the reasoning markers: ids given by the caller, else the marker texts (``<think>``,
   ``</think>``) tokenized by the server's own tokenizer (``POST /tokenize``);
3. ``POST /v1/chat/completions``: the reported request (``thinking_token_budget``, ``max_tokens``,
   greedy, ``chat_template_kwargs`` ``enable_thinking`` / ``preserve_thinking``,
   ``return_token_ids``) plus ``logprobs`` / ``top_logprobs`` and ``return_tokens_as_token_ids``;
4. per emitted position, the *forced column*: the budget's forcing writes +1e9 into one logit
   column (``vllm/v1/worker/gpu/sample/thinking_budget.py``, 0.28–0.34), which vLLM returns only
   when the server runs ``--logprobs-mode processed_logprobs`` (the column's logprob is 0, every
   other one -1e9, clamped to -9999 by the server) or ``processed_logits`` (its logit >=
   ``budget.FORCED_LOGIT``); with the default raw logprobs the forcing is invisible;
5. the logprobs mode: from the response when a forced column is seen, else from a control (two
   one-token requests without budget at temperature 1 and 0.5: processed values depend on the
   temperature, raw ones do not; ``infer_mode``);
6. markers given that are not the server's own (``marker_mismatch``) stop the check with one
   line naming the server's values (``MarkerMismatch``, exit 2): a wrong setting, not "violated";
7. the verdict by the one budget rule (``workbook.core.budget``: the prompt's reasoning count
   read back from the returned prompt ids, the output, the budget), and per position what the
   forced column says about where the end marker was lost (``judge_positions``).

``judge_positions`` is also the in-process equivalent (``from_request_output``: ``vllm.LLM``
with ``logprobs_mode="processed_logprobs"``), for hosts without vLLM's server packages.

What it can tell, compared to the hooked run (``workbook run``: tracer, diagnosis, probes):
it sees the emitted tokens and, with processed logprobs, whether the budget's bias was set in
the row each emitted token was sampled from. So a violation splits into "not forced" (the bias
never reached that row: registration, gate, launch, device state or kernel) and "forced, not
emitted" (lost after the bias: sampling, acceptance or commit); a due position whose emitted
token has no logprobs at all was changed after vLLM's sampler scored the position (the server
returns top logprobs only for a token the sampler scored). It cannot see draft rows or
rejected tokens, the gate, the fast path, the device budget or markers, the marker cache,
which of those stages lost it, or anything about start-up; without a processed logprobs mode
it judges the tokens only. ``report_hints``: under a violation, where the result is kept and
the commands that reproduce it on plain vLLM and write its upstream report.

Not here: the HTTP transport, the served model and the markers' ids (``workbook.run.serverapi``),
starting a server (``workbook.run.server``), hooks of any kind, streaming.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from workbook.core import budget
from workbook.core.budget import Markers
# the server's transport, and the names callers read from here (serverconstraints, cli)
from workbook.run.serverapi import (TIMEOUT_S, Endpoint, ServerCheckError, entry_token_id, served_model,
                                    server_markers)
from workbook.run.verdicts import say

MODES = ("auto", "processed_logprobs", "processed_logits", "raw")
START_TEXT, END_TEXT = "<think>", "</think>"  # the reasoning parsers' markers (qwen3, deepseek)
CLAMP = -9999.0  # vLLM's OpenAI server clamps every logprob to at least this
FORCED_LOGPROB = -1e-3  # processed_logprobs: the forced column's logprob is 0 (float32)
TOP_LOGPROBS = 5
CAN_TELL = (
    "What this check can tell: the emitted tokens against the budget rule and, with processed "
    "logprobs (server flag --logprobs-mode processed_logprobs or processed_logits), whether the "
    "budget's +1e9 was set in the row each emitted token was sampled from: a violation is then "
    "either 'not forced' (the bias never reached the row: registration, gate, launch, device "
    "state or kernel) or 'forced, not emitted' (lost after the bias: sampling, acceptance or "
    "commit).")
CANNOT_TELL = (
    "What it cannot tell (the hooked run can: workbook run, with the plugin installed in the "
    "server): draft rows and rejected tokens, the per-slot gate and fast path, the device "
    "budget, markers and marker cache, which of the stages before or after the bias lost the "
    "budget, and anything that happened at start-up.")
RAW_ONLY = (
    "The server returns raw logprobs (started without --logprobs-mode processed_logprobs or "
    "processed_logits): the budget's forcing is invisible, so only the emitted tokens are "
    "judged. Restart the server with --logprobs-mode processed_logprobs to see the forced column.")


class MarkerMismatch(ServerCheckError):
    """The markers given are not the server's: a wrong setting, not a vLLM defect."""


# --- the request ------------------------------------------------------------------------------

@dataclass
class Request:
    """The reported request (issue #54906), with logprobs."""

    prompt: str = "What is 1+1?"
    budget: int = 1
    max_tokens: int = 32
    enable_thinking: bool = True
    preserve_thinking: bool = True
    top_logprobs: int = TOP_LOGPROBS

    def body(self, model: str, *, temperature: float = 0.0, budget: int | None = "self",
             max_tokens: int | None = None) -> dict:
        b = self.budget if budget == "self" else budget
        body = {"model": model, "messages": [{"role": "user", "content": self.prompt}],
                "max_tokens": max_tokens or self.max_tokens, "temperature": temperature,
                "top_p": 1.0, "top_k": -1, "seed": 0,
                "chat_template_kwargs": {"enable_thinking": self.enable_thinking,
                                         "preserve_thinking": self.preserve_thinking},
                "return_token_ids": True, "logprobs": True,
                "top_logprobs": self.top_logprobs, "return_tokens_as_token_ids": True}
        if b is not None:
            body["thinking_token_budget"] = b
        return body


# --- per position -----------------------------------------------------------------------------

def tops_from_openai(choice: dict, output: Sequence[int]) -> list[dict[int, float]]:
    """Per emitted position ``{token id: value}`` from a chat choice's ``logprobs.content``
    (the emitted token and its ``top_logprobs``; tokens as ``token_id:N`` strings)."""
    content = ((choice.get("logprobs") or {}).get("content")) or []
    out = []
    for i, pos in enumerate(content):
        emitted = output[i] if i < len(output) else None
        d: dict[int, float] = {}
        if not pos.get("top_logprobs"):
            # vLLM leaves them out when the emitted token is not among the tokens its sampler
            # scored at this position (only ``logprob`` -9999 comes back): no values
            out.append(d)
            continue
        for e in pos.get("top_logprobs") or []:
            t = entry_token_id(e)
            if t is not None:
                d[t] = float(e["logprob"])
        t = entry_token_id(pos, emitted)
        if t is not None and t not in d:
            d[t] = float(pos["logprob"])
        out.append(d)
    return out


def forced_column(top: dict[int, float], mode: str) -> int | None:
    """The column the budget's +1e9 was written to, from one position's top values; None when
    no column carries it. ``mode``: processed_logits or processed_logprobs."""
    if not top:
        return None
    tok, val = max(top.items(), key=lambda kv: kv[1])
    if mode == "processed_logits":
        return tok if val >= budget.FORCED_LOGIT else None
    others = [v for t, v in top.items() if t != tok]
    # logprob 0 and every other column at -1e9 (clamped to -9999 by the server)
    if val >= FORCED_LOGPROB and others and max(others) <= CLAMP + 1:
        return tok
    return None


def mode_from_tops(tops: Sequence[dict[int, float]]) -> str | None:
    """The processed mode a forced column shows by itself (None: no position shows one)."""
    for top in tops:
        if forced_column(top, "processed_logits") is not None:
            return "processed_logits"
        if forced_column(top, "processed_logprobs") is not None:
            return "processed_logprobs"
    return None


@dataclass
class Position:
    index: int
    token: int
    due: int | None  # the end-marker token the budget puts here (None: not due)
    forced: int | None  # the forced column seen (None: none; always None in raw mode)
    top_value: float | None  # the highest returned value at this position
    status: str
    ok: bool


def judge_positions(prompt: Sequence[int], output: Sequence[int],
                    tops: Sequence[dict[int, float]] | None, budget_value: int | None,
                    markers: Markers, mode: str) -> dict[str, Any]:
    """Each emitted position against the budget rule (``budget.judge``) and, in a processed
    mode, against the forced column; the verdict and the first violating position."""
    markers = Markers.of(markers)
    j = budget.judge(prompt, output, budget_value, markers)
    exp = j.expected_end_index
    end = list(markers.end)
    processed = mode in ("processed_logits", "processed_logprobs")
    rows: list[Position] = []
    for i, tok in enumerate(output):
        top = tops[i] if tops is not None and i < len(tops) else {}
        # the one rule per row: what the budget must force after prompt + output[:i]
        truth = budget.row_truth(list(prompt) + list(output[:i]), [], 0, budget_value, markers,
                                 prompt_len=len(prompt))
        due = truth.token if truth.due else None
        forced = forced_column(top, mode) if processed else None
        emitted_ok = due is None or tok == due
        if not processed:
            status = "-" if due is None else ("end marker emitted" if emitted_ok
                                              else "NOT EMITTED (tokens only)")
            ok = emitted_ok
        elif due is None:
            ok = forced is None
            status = "-" if ok else "FORCED WHERE THE BUDGET DOES NOT BIND"
        elif forced is not None and forced != due:
            ok, status = False, f"FORCED THE WRONG COLUMN ({forced})"
        elif not top and tok != due:
            ok = False
            status = ("NOT EMITTED, and no logprobs for the emitted token: vLLM scored another "
                      "token at this position (changed after sampling?)")
        elif tok == due:
            ok = True
            status = "forced and emitted" if forced == due else \
                "emitted, no forced column (written by the model?)"
        else:
            ok = False
            status = ("FORCED, NOT EMITTED: lost after the bias (sampling, acceptance or "
                      "commit)" if forced == due else
                      "NOT FORCED: the bias never reached this row (registration, gate, "
                      "launch, device state or kernel)")
        rows.append(Position(i, int(tok), due, forced, max(top.values()) if top else None,
                             status, ok))
    bad = [p for p in rows if not p.ok]
    if j.honored is False or (processed and bad):
        verdict = "violated"
    elif j.honored:
        verdict = "honored"
    else:
        verdict = "inconclusive"
    notes = []
    if exp is None:
        notes.append("the budget does not bind in this output (no reasoning section in the "
                     "prompt, no budget, or the model ended reasoning itself first)")
    elif exp + len(end) > len(output):
        notes.append(f"the output stopped ({len(output)} tokens) before the end marker could "
                     f"be complete at index {exp}")
    if processed and verdict == "honored" and any(p.due is not None and p.forced is None
                                                  for p in rows):
        notes.append("the end marker came where due but without the forced column: the model "
                     "wrote it itself, or the bias was lost and the model happened to agree")
    return {"verdict": verdict, "mode": mode, "expected_end_index": exp,
            "actual_end_index": j.actual_end_index, "first_bad": asdict(bad[0]) if bad else None,
            "positions": [asdict(p) for p in rows], "notes": notes,
            "markers": markers.to_dict(), "budget": budget_value,
            "prompt_reasoning_count": budget.reasoning_count(prompt, markers)
            if markers.complete else None}


# --- the user's markers against the server's ---------------------------------------------------

def _find(seq: Sequence[int], sub: Sequence[int]) -> int | None:
    """The first index of ``sub`` in ``seq`` (None: absent or empty)."""
    n = len(sub)
    return next((i for i in range(len(seq) - n + 1) if n and list(seq[i:i + n]) == list(sub)),
                None)


def marker_mismatch(given: Markers, server: Markers, prompt: Sequence[int],
                    output: Sequence[int], tops: Sequence[dict[int, float]],
                    mode: str) -> dict[str, Any] | None:
    """Evidence that the markers given are not the ones the server runs, else None.

    ``server``: the server's own markers (its tokenizer's ``<think>`` / ``</think>``). Given
    markers that differ from them are the user's setting, which the server's behaviour settles:

    1. in a processed logprobs mode, the first column that got the budget's bias is the end
       marker the server forces: the server's own ``</think>`` and not the given end → wrong
       setting; the given end → the given markers are the server's (another parser), judged;
       a third column → a defect whichever markers are right (steps 2-3 still run);
    2. the prompt: the server's start marker in it and the given one not → wrong setting;
    3. the output: the server's end marker in it and the given one never → wrong setting;
    4. a third column and neither 2 nor 3: evidence ``neither``, judged with the given markers.
    """
    given, server = Markers.of(given), Markers.of(server)
    if (given.start, given.end) == (server.start, server.end) or not server.complete:
        return None
    processed = mode in ("processed_logits", "processed_logprobs")
    forced = None  # (output position, column) of the first forced column
    for i, top in enumerate(tops if processed else ()):
        if forced is None and forced_column(top, mode) is not None:
            forced = (i, forced_column(top, mode))
    if forced and given.end and forced[1] == given.end[0]:
        return None
    if forced and forced[1] == server.end[0]:
        return {"evidence": "forced", "position": forced[0], "column": forced[1]}
    if _find(prompt, server.start) is not None and _find(prompt, given.start) is None:
        return {"evidence": "prompt", "position": _find(prompt, server.start)}
    at = _find(output, server.end)
    if at is not None and _find(output, given.end) is None:
        return {"evidence": "output", "position": at}
    return {"evidence": "neither", "position": forced[0], "column": forced[1]} if forced \
        else None


def mismatch_line(given: Markers, server: Markers, found: dict[str, Any],
                  texts: dict[int, str | None],
                  given_texts: tuple[str, str] | None = None) -> str:
    """One line: the markers given (``given_texts``: the texts they came from), the server's,
    the evidence, the flag that matches."""
    ids = ids_text
    given_one = (lambda seq, i: f"{ids(seq)} ({json.dumps(given_texts[i])})" if given_texts
                 else ids(seq))

    def shown(seq):
        txt = "".join(texts.get(t) or "" for t in seq)
        return f"{ids(seq)} ({json.dumps(txt)})" if txt else ids(seq)

    if found["evidence"] == "forced":
        why = (f"the server forced {shown([found['column']])} at output position "
               f"{found['position']}")
    elif found["evidence"] == "prompt":
        why = (f"the prompt opens its reasoning with {shown(server.start)} at prompt position "
               f"{found['position']}, and the start marker given is not in the prompt")
    else:
        why = (f"the output ends its reasoning with {shown(server.end)} at position "
               f"{found['position']}, and the end marker given never appears")
    return (f"the reasoning markers given (start {given_one(given.start, 0)}, end "
            f"{given_one(given.end, 1)}) are not the server's: its tokenizer reads {json.dumps(START_TEXT)} as "
            f"{ids(server.start)} and {json.dumps(END_TEXT)} as {ids(server.end)}, and {why}. "
            f"A wrong setting, not a vLLM defect: nothing judged; rerun without --marker-ids / "
            f"--start / --end, or with --marker-ids {ids(server.start)}/{ids(server.end)}")


# --- the logprobs mode ------------------------------------------------------------------------

def infer_mode(ep: Endpoint, model: str, req: Request) -> tuple[str, dict]:
    """processed_logits / processed_logprobs / raw from two one-token requests without a
    budget, at temperature 1 and 0.5: processed values are taken after the temperature, raw
    ones before it. Same prompt, so the first position's logits are the same in both."""
    vals = {}
    for t in (1.0, 0.5):
        resp = ep.post("/v1/chat/completions", req.body(model, temperature=t, budget=None,
                                                       max_tokens=1))
        content = ((resp["choices"][0].get("logprobs") or {}).get("content")) or []
        if not content:
            raise ServerCheckError("the server returned no logprobs (was it started with "
                                   "--max-logprobs 0?)")
        vals[t] = {entry_token_id(e): float(e["logprob"]) for e in content[0].get("top_logprobs")
                   or []}
    common = sorted(set(vals[1.0]) & set(vals[0.5]))
    evidence = {"control_t1": {str(k): vals[1.0][k] for k in common},
                "control_t05": {str(k): vals[0.5][k] for k in common}}
    if len(common) < 2:
        return "unknown", evidence
    a = [vals[1.0][k] for k in common]
    b = [vals[0.5][k] for k in common]
    spread = max(a) - min(a)
    if spread <= 0:
        return "unknown", evidence  # a flat distribution looks the same either way
    if all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b)):
        return "raw", evidence
    if all(math.isclose(2 * x, y, rel_tol=1e-3, abs_tol=1e-6) for x, y in zip(a, b)):
        return "processed_logits", evidence  # logit / 0.5
    return "processed_logprobs", evidence


# --- the whole check --------------------------------------------------------------------------

@dataclass
class Result:
    url: str
    model: str
    request: dict
    mode: str
    mode_evidence: dict
    judged: dict
    finish_reason: str | None
    usage: dict
    prompt_tail: list[int]
    texts: dict = field(default_factory=dict)  # token id -> text, for the table

    @property
    def verdict(self) -> str:
        return self.judged["verdict"]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["can_tell"], d["cannot_tell"] = CAN_TELL, CANNOT_TELL
        return d


def check(url: str, model: str | None = None, *, req: Request | None = None,
          mode: str = "auto", markers: Markers | None = None, start_text: str = "<think>",
          end_text: str = "</think>", timeout: float = TIMEOUT_S,
          api_key: str | None = None) -> Result:
    """Send the reported request to the server at ``url`` and judge it (see the module doc)."""
    if mode not in MODES:
        raise ServerCheckError(f"mode={mode!r} is unknown; choose one of {MODES}")
    req = req or Request()
    ep = Endpoint(url, timeout, api_key)
    model = served_model(ep, model)
    try:  # the server's own markers (its tokenizer's <think> / </think>)
        own = server_markers(ep, model, START_TEXT, END_TEXT)
    except ServerCheckError:
        own = None  # a tokenizer without those texts: only given markers can be used
    given_texts = None
    if markers is not None and Markers.of(markers).complete:
        markers = Markers.of(markers)
    elif own is not None and (start_text, end_text) == (START_TEXT, END_TEXT):
        markers = own
    else:
        markers = server_markers(ep, model, start_text, end_text)
        given_texts = (start_text, end_text)
    body = req.body(model)
    resp = ep.post("/v1/chat/completions", body)
    choice = resp["choices"][0]
    if choice.get("token_ids") is None or resp.get("prompt_token_ids") is None:
        raise ServerCheckError("the server returned no token ids (return_token_ids): it needs "
                               "a vLLM with return_token_ids in its chat API (0.11+)")
    prompt = [int(t) for t in resp["prompt_token_ids"]]
    output = [int(t) for t in choice["token_ids"]]
    tops = tops_from_openai(choice, output)
    evidence: dict = {}
    if mode == "auto":
        seen = mode_from_tops(tops)
        if seen is not None:
            mode, evidence = seen, {"from": "a forced column in the response"}
        else:
            mode, evidence = infer_mode(ep, model, req)
            evidence["from"] = "temperature control (two one-token requests, no budget)"
            if mode == "unknown":
                mode = "raw"
                evidence["note"] = ("the control could not tell the mode (flat logits); the "
                                    "tokens are judged only")
    mismatch = marker_mismatch(markers, own, prompt, output, tops, mode) if own else None
    texts = {}
    try:  # readable tokens for the table; the verdict never depends on them
        ids = set(output) | set(markers.start) | set(markers.end)
        if mismatch:
            ids = set(own.start) | set(own.end) | {mismatch.get("column", own.end[0])}
        for t in sorted(ids):
            texts[t] = ep.post("/detokenize", {"model": model, "tokens": [t]}).get("prompt")
    except ServerCheckError:
        pass
    if mismatch and mismatch["evidence"] != "neither":
        raise MarkerMismatch(mismatch_line(markers, own, mismatch, texts, given_texts))
    judged = judge_positions(prompt, output, tops, req.budget, markers, mode)
    if mismatch:
        judged["notes"].append(
            f"the markers given differ from the server's own ({json.dumps(START_TEXT)} "
            f"{ids_text(own.start)}, {json.dumps(END_TEXT)} {ids_text(own.end)}), and the server forced "
            f"{mismatch['column']} at output position {mismatch['position']}, neither end "
            f"marker: judged with the markers given; --marker-ids {ids_text(own.start)}/"
            f"{ids_text(own.end)} judges against the server's own")
    return Result(url=ep.base, model=model, request=body, mode=mode, mode_evidence=evidence,
                  judged=judged, finish_reason=choice.get("finish_reason"),
                  usage=resp.get("usage") or {}, prompt_tail=prompt[-4:], texts=texts)


# --- the in-process equivalent ----------------------------------------------------------------

def from_request_output(out, budget_value: int | None, markers: Markers,
                        mode: str) -> dict[str, Any]:
    """``judge_positions`` for a ``vllm.RequestOutput`` of an ``LLM`` built with
    ``logprobs_mode=mode`` and sampled with ``SamplingParams(logprobs=K)``."""
    comp = out.outputs[0]
    tops = [{int(t): float(lp.logprob) for t, lp in (d or {}).items()}
            for d in (comp.logprobs or [])]
    return judge_positions(list(out.prompt_token_ids), list(comp.token_ids), tops,
                           budget_value, markers, mode)


# --- text -------------------------------------------------------------------------------------

def ids_text(v) -> str:
    """Marker ids in a line of text: "248068" / "248068 248069"; "none" when absent."""
    return " ".join(str(int(t)) for t in v) if v else "none"


def render(res: Result) -> str:
    j = res.judged
    t = res.texts

    def name(tok):
        if tok is None:
            return "-"
        s = t.get(tok, t.get(str(tok)))  # str keys after a JSON round trip
        return f"{tok} {json.dumps(s)}" if s is not None else str(tok)

    mk = j.get("markers") or {}
    lines = [f"server {res.url}  model {res.model}",
             f"request: thinking_token_budget {say(j['budget'], 'none (no budget)')}, "
             f"max_tokens {say(res.request.get('max_tokens'), 'the server default')}, greedy, "
             "enable_thinking, return_token_ids, top_logprobs "
             f"{say(res.request.get('top_logprobs'))}",
             f"prompt tail {say(res.prompt_tail, 'not returned')}; reasoning tokens in the "
             "prompt: " + say(j.get("prompt_reasoning_count"),
                              "not counted (the start, end or natural-end marker ids are "
                              "missing)")
             + f"; markers start {ids_text(mk.get('start'))} end {ids_text(mk.get('end'))}",
             f"logprobs mode: {res.mode} ({res.mode_evidence.get('from', 'given')})",
             f"finish_reason {say(res.finish_reason, 'not reported')}, completion tokens "
             f"{say(res.usage.get('completion_tokens'), 'not reported')}, end marker expected "
             "at index " + say(j.get("expected_end_index"), "none (the budget does not bind "
                                                             "in this output)")
             + f", found at {say(j.get('actual_end_index'), 'no index (not in the output)')}",
             ""]
    lines.append(f"{'pos':>4}  {'emitted':<24} {'due':<24} {'forced column':<24} "
                 f"{'top value':>12}  status")
    shown = 0
    for p in j["positions"]:
        if p["due"] is None and p["forced"] is None and p["ok"] and p["index"] > \
                (j["expected_end_index"] or 0) + len(j["markers"]["end"]) + 2:
            continue  # the rest of the output says nothing about the budget
        tv = "-" if p["top_value"] is None else f"{p['top_value']:.4g}"
        forced = "n/a (raw)" if res.mode == "raw" else name(p["forced"])
        lines.append(f"{p['index']:>4}  {name(p['token']):<24} {name(p['due']):<24} "
                     f"{forced:<24} {tv:>12}  {p['status']}")
        shown += 1
    if shown < len(j["positions"]):
        lines.append(f"      ... {len(j['positions']) - shown} later positions: not due, "
                     "nothing forced")
    lines.append("")
    fb = j["first_bad"]
    if j["verdict"] == "violated" and fb is not None:
        lines.append(f"VERDICT: violated at output position {fb['index']}: {fb['status']}")
    else:
        lines.append(f"VERDICT: {j['verdict']}")
    for n in j["notes"]:
        lines.append(f"note: {n}")
    if res.mode == "raw":
        lines.append(RAW_ONLY)
    lines += ["", CAN_TELL, CANNOT_TELL]
    return "\n".join(lines)


def report_hints(json_out: str | None, data: dict, keys: list) -> None:
    """Under a violation (``workbook check-server``): where the result is kept (``--json``, else
    ``outputs/servers/``) and, per violated case (``keys``; ``[None]`` for the budget's check),
    the commands for its plain-vLLM reproducer and upstream report."""
    import time

    from workbook.run.verdicts import report_lines

    path = json_out
    if not path:
        path = os.path.join("outputs", "servers", time.strftime("check-%Y%m%d-%H%M%S.json"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
    print(f"\nthe result is kept in {path}; per violation:")
    for k in keys:
        print("\n".join(([f"  {k}:"] if k else []) + report_lines(path, k)))
