"""An OpenAI-compatible vLLM server reached over HTTP: the transport of the server checks.

``Endpoint(url)`` (``http://host:port``, ``/v1`` optional, an API key when the server wants one)
sends JSON and reads JSON back with the standard library (``urllib``); every way that fails —
unreachable, an HTTP error (the server's own message quoted), an answer that is not JSON — is
one ``ServerCheckError`` whose one line names it, never a traceback. ``served_model`` picks the
model to ask from ``GET /v1/models`` (the one named, refused when not served; else the first);
``server_markers`` reads the reasoning markers' ids as the server's own tokenizer splits their
texts (``POST /tokenize``, no special tokens added).

Used by ``workbook check-server`` (``workbook.run.servers.check``, which keeps these names
importable from it), its ``--constraints`` cases (``workbook.run.servers.constraints``) and the grid
over ``vllm serve`` (``workbook.run.constraints.served``).

Deliberately not here: which request to send, judging any answer (``servercheck``,
``serverconstraints``), starting or stopping a server (``workbook.run.server``), streaming.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Sequence

from workbook.core.budget import Markers

TIMEOUT_S = 300.0


class ServerCheckError(RuntimeError):
    """The check could not be made (unreachable server, unknown model, refused request, ...)."""


class Endpoint:
    """An OpenAI-compatible vLLM server at ``url`` (``http://host:port``, ``/v1`` optional)."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S, api_key: str | None = None):
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.base = url[:-3] if url.endswith("/v1") else url
        self.timeout = timeout
        self.api_key = api_key

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ServerCheckError(f"{self.base}{path}: the server answered HTTP {e.code}: "
                                   f"{_message(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerCheckError(f"cannot reach a server at {self.base} ({reason}); is "
                                   "`vllm serve` running there?") from None
        except ValueError as e:
            raise ServerCheckError(f"{self.base}{path} did not answer JSON ({e}): not an "
                                   "OpenAI-compatible vLLM server?") from None

    def get(self, path: str) -> dict:
        return self._call("GET", path)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, body)


def _message(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
    except Exception:
        return str(e.reason)
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def served_model(ep: Endpoint, model: str | None) -> str:
    data = ep.get("/v1/models").get("data") or []
    ids = [m.get("id") for m in data]
    if not ids:
        raise ServerCheckError(f"{ep.base}/v1/models lists no model")
    if model is None:
        return ids[0]
    if model not in ids:
        raise ServerCheckError(f"the server at {ep.base} does not serve {model!r}; it serves "
                               f"{', '.join(map(repr, ids))}")
    return model


def server_markers(ep: Endpoint, model: str, start: str, end: str,
                   natural_end: str | None = None) -> Markers:
    """The markers as the server's tokenizer splits their texts (no special tokens added)."""
    def ids(text):
        out = ep.post("/tokenize", {"model": model, "prompt": text,
                                    "add_special_tokens": False}).get("tokens")
        if not out:
            raise ServerCheckError(f"the server's tokenizer gives no tokens for {text!r}")
        return [int(t) for t in out]

    return Markers(ids(start), ids(end), ids(natural_end) if natural_end else ())


# --- the wire format of a completion: the body sent, the logprobs read back ---------------------

def entry_token_id(entry: dict, fallback: int | None = None) -> int | None:
    tok = entry.get("token")
    if isinstance(tok, str) and tok.startswith("token_id:"):
        try:
            return int(tok.split(":", 1)[1])
        except ValueError:
            return fallback
    return fallback


def completion_body(model: str, prompt: list[int], kw: dict, *, max_tokens: int,
                    logprobs: int, token_ids: Sequence[int] = ()) -> dict:
    """``/v1/completions`` for the case keywords ``kw`` (``SamplingParams`` names; the grid's
    base: greedy, ``ignore_eos``), with logprobs (``token_ids``: the columns to return at every
    position, vLLM's ``logprob_token_ids``)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "temperature": 0.0,
                            "max_tokens": max_tokens, "ignore_eos": True, "seed": 0,
                            "return_token_ids": True, "return_tokens_as_token_ids": True,
                            "logprobs": logprobs, "skip_special_tokens": True}
    for k, v in kw.items():
        if k == "logit_bias":
            body[k] = {str(t): float(b) for t, b in v.items()}
        elif k == "logprobs":
            body[k] = max(int(v), 0)
        else:
            body[k] = v
    if token_ids:
        body["logprob_token_ids"] = sorted({int(t) for t in token_ids})
    return body


def choice_top_logprobs(choice: dict) -> list[dict[int, float]]:
    """Per output position ``{token id: value}`` from a completion's ``logprobs``."""
    lp = choice.get("logprobs") or {}
    out = []
    for i, d in enumerate(lp.get("top_logprobs") or []):
        row: dict[int, float] = {}
        for tok, v in (d or {}).items():
            t = entry_token_id({"token": tok})
            if t is not None and v is not None:
                row[t] = float(v)
        out.append(row)
    return out


def position_logprobs(choice: dict) -> list[dict[int, float]]:
    """Per output position ``{token id: logprob}``: the top logprobs and the emitted token's own
    (``token_logprobs``), as ``RequestOutput.logprobs`` holds them (the served grid's cells)."""
    tops = choice_top_logprobs(choice)
    own = choice_token_logprobs(choice) or []
    ids = [int(t) for t in choice.get("token_ids") or []]
    out = []
    for i, t in enumerate(ids):
        row = dict(tops[i]) if i < len(tops) else {}
        if i < len(own) and own[i] is not None:
            row[t] = own[i]
        out.append(row)
    return out


def choice_token_logprobs(choice: dict) -> list[float | None] | None:
    """The logprob of each returned token (``token_logprobs``); None when none came back."""
    lp = choice.get("logprobs")
    if not lp or lp.get("token_logprobs") is None:
        return None
    return [None if v is None else float(v) for v in lp["token_logprobs"]]


def choice_prompt_logprobs(resp: dict, choice: dict) -> list[dict | None] | None:
    """The prompt logprobs a completion returned, per prompt position ``{id: logprob}``."""
    pl = choice.get("prompt_logprobs", resp.get("prompt_logprobs"))
    if pl is None:
        return None
    return [None if d is None else {int(t): float(v["logprob"] if isinstance(v, dict) else v)
                                    for t, v in d.items()} for d in pl]
