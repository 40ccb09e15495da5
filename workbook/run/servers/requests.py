"""The requests ``workbook check-server --constraints`` sends and what it reads back: a case's
prompt through the server's chat template, the ``/v1/completions`` body of a case's keywords
(the one mapping of ``SamplingParams`` names to the HTTP API, also the served grid's), the
returned tokens and logprobs (``Sent``), the banned words as the server's tokenizer splits them,
the control rows at the case's own output prefix (``aligned_control``) and the grammar evidence
of a JSON-schema case (``grammar_evidence``).

Not here: judging (``workbook.run.servers.constraints``), the contracts, the endpoint
(``servercheck.Endpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbook.core import contracts
from workbook.core.budget import Markers
from workbook.core.contracts import Params
from workbook.run.constraints import cases as C
from workbook.run.servers import check as sc
from workbook.run.serverapi import (choice_prompt_logprobs, choice_token_logprobs, choice_top_logprobs,
                                    completion_body)

CONTROL_CONCURRENCY = 8  # one-token control requests in flight (workbook serve: --max-num-seqs 8)
# what the server's tokenizer must split as the local one does before the grammar is judged
GRAMMAR_PROBE = '{"a": -1000000000, "b": [1.5e3, true, null]}\n</think>'


def prompt_ids(ep: sc.Endpoint, model: str, name: str) -> list[int]:
    """The case's prompt (``constraints.PROMPT_TEXT`` or "Say <name>.") through the server's
    chat template, thinking on except for ``constraints.NO_THINKING``."""
    text = C.PROMPT_TEXT.get(name, f"Say {name}.")
    r = ep.post("/tokenize", {"model": model, "messages": [{"role": "user", "content": text}],
                              "add_generation_prompt": True,
                              "chat_template_kwargs": {"enable_thinking":
                                                       name not in C.NO_THINKING}})
    return [int(t) for t in r.get("tokens") or []]


@dataclass
class Sent:
    """One completion: what was sent and what came back."""

    body: dict
    prompt: list[int]
    output: list[int]
    finish_reason: str | None
    text: str | None
    tops: list[dict[int, float]]
    logprobs: list[float | None] | None
    prompt_logprobs: list[dict | None] | None


def send(ep: sc.Endpoint, body: dict) -> Sent:
    resp = ep.post("/v1/completions", body)
    ch = resp["choices"][0]
    if ch.get("token_ids") is None:
        raise sc.ServerCheckError("the server returned no token ids (return_token_ids): it "
                                  "needs a vLLM with return_token_ids (0.11+)")
    prompt = ch.get("prompt_token_ids") or resp.get("prompt_token_ids") or body["prompt"]
    return Sent(body, [int(t) for t in prompt], [int(t) for t in ch["token_ids"]],
                ch.get("finish_reason"), ch.get("text"), choice_top_logprobs(ch), choice_token_logprobs(ch),
                choice_prompt_logprobs(resp, ch))


def bad_word_ids(ep: sc.Endpoint, model: str, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Each banned word as the server's tokenizer splits it, bare and after a space (both
    spellings end the word; vLLM bans the last token of either)."""
    out = []
    for w in words:
        for text in (w, " " + w):
            ids = ep.post("/tokenize", {"model": model, "prompt": text,
                                        "add_special_tokens": False}).get("tokens") or []
            if ids and tuple(ids) not in out:
                out.append(tuple(int(t) for t in ids))
    return out


def aligned_control(ep: sc.Endpoint, model: str, case: Sent, k: int, max_tokens: int) -> Sent:
    """The control of ``case``: per output index ``i``, the raw row of the same prompt and the
    same output prefix ``case.output[:i]`` without the constraint. One unconstrained request
    gives the rows up to where its greedy output leaves the case's; past that, each row is one
    one-token request on the prompt + the case's prefix (the same token sequence: the same raw
    row) returning the columns the case returned there (``logprob_token_ids``: one token is
    what a server with MTP answers; longer lists fail there, docs/server-check.md). A position
    the server refuses ends the control there."""
    from concurrent.futures import ThreadPoolExecutor

    full = send(ep, completion_body(model, case.prompt, {}, max_tokens=max_tokens, logprobs=k))

    def one(i: int) -> dict[int, float] | None:
        if full.output[:i] == case.output[:i] and i < len(full.tops):
            return full.tops[i]
        cols = set(case.tops[i]) | ({case.output[i]} if i < len(case.output) else set())
        try:
            got = send(ep, completion_body(model, case.prompt + case.output[:i], {},
                                           max_tokens=1, logprobs=k, token_ids=sorted(cols)))
        except sc.ServerCheckError:
            return None
        return got.tops[0] if got.tops else None

    with ThreadPoolExecutor(CONTROL_CONCURRENCY) as pool:  # the server batches them
        rows = list(pool.map(one, range(len(case.tops))))
    tops = rows[:rows.index(None)] if None in rows else rows
    return Sent(full.body, case.prompt, case.output[:len(tops)], full.finish_reason, None, tops,
                None, None)


def model_root(ep: sc.Endpoint, model: str) -> str:
    """Where the server loaded ``model`` from (``/v1/models``' ``root``; else its name)."""
    for m in ep.get("/v1/models").get("data") or []:
        if m.get("id") == model:
            return str(m.get("root") or model)
    return model


def grammar_evidence(ep: sc.Endpoint, model: str, p: Params, case: Sent, markers: Markers
                     ) -> tuple[contracts.GrammarTruth | None, str | None,
                                Callable[[int], Any] | None]:
    """For a case with a JSON schema: the returned tokens through the request's grammar
    (``contracts.GrammarTruth``, judged by the structured-output contract's own output check),
    compiled by ``workbook.vllm.grammar.for_model`` from the folder the server loaded the model
    from, once the server's tokenizer splits ``GRAMMAR_PROBE`` as that folder's does; the
    grammar starts after the reasoning (``grammar.grammar_start``: from output index 0 when the
    prompt already ended it, as the structured case's does; a prompt that leaves the reasoning
    open carries a budget, which a server without a reasoning parser refuses). The third
    item: what the grammar allows at output index ``i`` (None before it starts and where the
    output already left or ended it; ``row_breaches``). (None, why, None) when no evidence
    can be built."""
    if p.json_schema is None:
        return None, None, None
    from workbook.vllm import grammar as vgrammar

    root = model_root(ep, model)
    chk, why, tok = vgrammar.for_model(root, p)
    if chk is None:
        return None, why, None
    server = [int(t) for t in ep.post("/tokenize", {"model": model, "prompt": GRAMMAR_PROBE,
                                                    "add_special_tokens": False}
                                      ).get("tokens") or []]
    local = [int(t) for t in tok.encode(GRAMMAR_PROBE, add_special_tokens=False)]
    if server != local:
        return None, (f"the tokenizer at {root} splits {GRAMMAR_PROBE!r} into {len(local)} "
                      f"tokens, the server's into {len(server)}: not the server's "
                      "tokenizer"), None

    def allowed(i: int):
        seen = case.output[:i]
        start = vgrammar.grammar_start(case.prompt, seen, markers, True)
        return None if start is None or start > i else chk.allowed_mask(seen[start:])

    return chk.truth(case.prompt, case.output, markers, reasoning=True), None, allowed
