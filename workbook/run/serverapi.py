"""An OpenAI-compatible vLLM server reached over HTTP: the transport of the server checks.

``Endpoint(url)`` (``http://host:port``, ``/v1`` optional, an API key when the server wants one)
sends JSON and reads JSON back with the standard library (``urllib``); every way that fails —
unreachable, an HTTP error (the server's own message quoted), an answer that is not JSON — is
one ``ServerCheckError`` whose one line names it, never a traceback. ``served_model`` picks the
model to ask from ``GET /v1/models`` (the one named, refused when not served; else the first);
``server_markers`` reads the reasoning markers' ids as the server's own tokenizer splits their
texts (``POST /tokenize``, no special tokens added).

Used by ``workbook check-server`` (``workbook.run.servercheck``, which keeps these names
importable from it), its ``--constraints`` cases (``workbook.run.serverconstraints``) and the grid
over ``vllm serve`` (``workbook.run.gridserve``).

Deliberately not here: which request to send, judging any answer (``servercheck``,
``serverconstraints``), starting or stopping a server (``workbook.run.server``), streaming.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

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
