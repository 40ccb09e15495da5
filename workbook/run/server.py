"""vLLM's OpenAI-compatible server for a ``RunConfig``: the process, the request, the traces.

Used by the pipeline's ``Served`` backend (``workbook.run.backends``):

1. ``Server.start()`` runs ``python -m vllm.entrypoints.openai.api_server`` as a subprocess in
   its own process group, bound to 127.0.0.1 on a free port (or the caller's port, refused up
   front if taken), with flags built from ``engine.engine_kwargs(cfg)`` (``server_args``) and
   the environment of ``workbook.vllm.env.server_env``; its output goes to ``server.log``; it
   waits for ``/health`` and ``/v1/models`` (``ServerDied`` / ``StartupTimeout`` carry the log
   tail);
2. ``Server.chat(cfg)`` sends the issue's chat completion with the OpenAI client
   (``chat_kwargs``: budget, ``chat_template_kwargs``, ``return_token_ids``, ...); a 4xx answer
   raises ``RequestRejected`` with the server's message;
3. ``outcome_from_response`` turns the response into ``request.Outcome`` (finish_reason, usage,
   reasoning tokens, content, token ids, judged by the one budget rule);
4. ``effective`` / ``await_trace`` read what vLLM's processes wrote through the plugin
   (``workbook.hooks.plugin``): the worker's ``effective.json`` and the per-process traces
   (flushed after every step, merged by ``workbook.core.tracefiles.load``);
5. ``Server.stop()`` sends SIGINT, then SIGTERM, then SIGKILL to its process group; it runs on
   success, on failure and on KeyboardInterrupt.

Not here: the hooks (installed inside vLLM by the plugin), check B (it edits model weights in
the engine process: in-process only), streaming, anything not on 127.0.0.1.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any


def _libc_prctl():
    """libc's ``prctl``, looked up in the parent (a forked child must not load libraries)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux / no prctl: the atexit and signal stops remain
        return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child in its own session: SIGTERM when the process that started it
    dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), so no server outlives its client."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

from workbook.core.budget import Markers, judge
from workbook.core.config import ConfigError, RunConfig
from workbook.run import request
from workbook.vllm import engine
from workbook.vllm import effective as veff
from workbook.vllm import env as wenv

MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"
LOG_TAIL = 40
STARTUP_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0


# --- errors ----------------------------------------------------------------------------------

class ServerError(RuntimeError):
    """The OpenAI server could not serve the run; ``log_tail`` holds its last log lines."""

    def __init__(self, message: str, log_tail: str = ""):
        self.log_tail = log_tail
        super().__init__(message + (f"\n--- server.log (last lines) ---\n{log_tail}"
                                    if log_tail else ""))


class PortBusy(ServerError):
    """The port asked for is already taken on 127.0.0.1 (checked before starting)."""


class ServerDied(ServerError):
    """The server process exited before it became ready."""


class StartupTimeout(ServerError):
    """The server did not become ready within the start-up timeout."""


class RequestRejected(ServerError):
    """The server answered the request with an HTTP 4xx; the run is recorded (``result``)."""

    def __init__(self, status: int, server_message: str, log_tail: str = ""):
        self.status = status
        self.server_message = server_message
        self.details = {"status": status, "server_message": server_message}
        super().__init__(f"the server rejected the request (HTTP {status}): {server_message}",
                         log_tail)


# --- command line and environment --------------------------------------------------------------

def engine_arg_names() -> set[str] | None:
    """Field names of the installed vLLM's ``EngineArgs`` (each is a ``--flag``), from source.

    Read from ``vllm/engine/arg_utils.py`` without importing vLLM (12-16 s); None if not found.
    """
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "engine", "arg_utils.py")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        src = f.read()
    return set(re.findall(r"^    (\w+): [^=\n]+=", src, flags=re.M))


def flag(name: str, value: Any) -> list[str]:
    """One engine kwarg as ``vllm serve`` flags (booleans as ``--x`` / ``--no-x``)."""
    opt = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [opt] if value else ["--no-" + name.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [opt, json.dumps(value)]
    return [opt, str(value)]


def server_args(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(flags, dropped kwarg names): ``engine_kwargs(cfg)`` as flags the installed vLLM knows."""
    kw = engine.engine_kwargs(cfg)
    known = engine_arg_names()
    args = ["--model", str(kw.pop("model"))]
    dropped = []
    for name, value in kw.items():
        if value is None:
            continue
        if known is not None and name not in known:
            dropped.append(name)
            continue
        args += flag(name, value)
    return args, dropped


# --- ports -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """Raise ``PortBusy`` if ``port`` cannot be bound on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise PortBusy(f"port {port} on {HOST} is already in use ({e}); pass port=None to "
                           "pick a free one") from None


# --- the server process ---------------------------------------------------------------------------

class Server:
    """One OpenAI-compatible vLLM server for ``cfg``; a context manager (stops on exit)."""

    def __init__(self, cfg: RunConfig, workdir: str | None = None, *, port: int | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S, python: str | None = None,
                 row_check_dir: str | None = None):
        self.cfg = cfg
        self.row_check_dir = row_check_dir  # the served grid's row check (cfg.row_check)
        self.workdir = workdir or tempfile.mkdtemp(prefix="workbook-server-")
        self.port = port
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.log_path = os.path.join(self.workdir, "server.log")
        self.worker_dir = os.path.join(self.workdir, "server_trace")
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the server's pid = its process group id; kept after stop
        self.model_id: str | None = None
        self.argv: list[str] = []
        self.dropped_flags: list[str] = []
        self.timings: dict[str, float] = {}

    # -- life cycle
    def start(self) -> "Server":
        if self.port is None:
            self.port = free_port()
        else:
            check_port(self.port)
        os.makedirs(self.worker_dir, exist_ok=True)
        flags, self.dropped_flags = server_args(self.cfg)
        self.argv = [self.python, "-m", MODULE, *flags, "--host", HOST, "--port", str(self.port)]
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL,
                                         env=wenv.server_env(self.cfg,
                                                             trace_dir=self.worker_dir,
                                                             effective_dir=self.worker_dir,
                                                             watch_dir=self.worker_dir
                                                             if self.cfg.watched else None,
                                                             row_check_dir=self.row_check_dir),
                                         start_new_session=True, preexec_fn=die_with_parent)
        self.pid = self.proc.pid
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.timings["server_start_s"] = time.perf_counter() - t0
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise ServerDied(f"the vLLM server exited with code {code} during start-up "
                                 f"(log: {self.log_path})", self.log_tail())
            models = self._get_json("/v1/models") if self._get_ok("/health") else None
            if models and models.get("data"):
                self.model_id = models["data"][0]["id"]
                return
            time.sleep(1.0)
        raise StartupTimeout(f"the vLLM server was not ready after {self.startup_timeout:.0f} s "
                             f"(log: {self.log_path})", self.log_tail())

    def stop(self) -> None:
        """SIGINT, then SIGTERM, then SIGKILL to the server's process group; idempotent."""
        atexit.unregister(self.stop)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.perf_counter()
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if proc.poll() is not None and not _group_alive(proc.pid):
                break
            _signal_group(proc.pid, sig)
            _wait_group(proc, wait)
        self.timings["server_stop_s"] = time.perf_counter() - t0

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    # -- HTTP
    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _get_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _get_json(self, path: str) -> dict | None:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=10) as r:
                return json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _post_json(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="EMPTY",
                             timeout=REQUEST_TIMEOUT_S, max_retries=0)

    def chat(self, cfg: RunConfig) -> dict:
        """Send the reported chat request for ``cfg``; the response as a plain dict.

        Raises ``RequestRejected`` (HTTP 4xx, with the server's message) or ``ServerError``.
        """
        import openai

        try:
            resp = self.client().chat.completions.create(**chat_kwargs(cfg, self.model_id))
        except openai.APIStatusError as e:
            if 400 <= e.status_code < 500:
                raise RequestRejected(e.status_code, _server_message(e), self.log_tail(10)) \
                    from None
            raise ServerError(f"the server failed the request (HTTP {e.status_code}): "
                              f"{_server_message(e)}", self.log_tail()) from None
        except openai.APIConnectionError as e:
            raise ServerError(f"lost the connection to the server ({e})", self.log_tail()) \
                from None
        return resp.model_dump()

    def detokenize(self, token_ids: list[int]) -> str | None:
        try:
            return self._post_json("/detokenize", {"model": self.model_id,
                                                   "tokens": list(token_ids)}).get("prompt")
        except (OSError, urllib.error.URLError, ValueError):
            return None

    # -- what the plugin wrote inside vLLM's processes
    def worker_effective(self, wait_s: float = 10.0) -> dict:
        """The model runner's ``effective.json`` (written on its first request)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = _read_effective(self.worker_dir)
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def frames(self) -> dict:
        """Merged per-process traces (``workbook.core.tracefiles.load``)."""
        from workbook.core.tracefiles import load

        return load(self.worker_dir)


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session: the group id is the server's pid
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_group(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        time.sleep(0.2)


def _server_message(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("message"):
            return str(body["message"])
    return str(getattr(e, "message", e))


def _read_effective(worker_dir: str) -> dict:
    best: dict = {}
    if not os.path.isdir(worker_dir):
        return best
    for d in sorted(os.listdir(worker_dir)):
        path = os.path.join(worker_dir, d, "effective.json")
        if os.path.exists(path):
            with open(path) as f:
                eff = json.load(f)
            if "runner_class" in eff or not best:
                best = eff
    return best


def traced_req_ids(frames: dict) -> set:
    regs = frames.get("registrations")
    if regs is None or "req_id" not in getattr(regs, "columns", ()):
        return set()
    return set(regs["req_id"])


# --- the request and its outcome --------------------------------------------------------------------

def chat_kwargs(cfg: RunConfig, model_id: str | None) -> dict[str, Any]:
    """``client.chat.completions.create`` arguments of the reported request for ``cfg``."""
    extra = {"thinking_token_budget": cfg.budget,
             "chat_template_kwargs": request.chat_template_kwargs(cfg),
             "return_token_ids": True, "ignore_eos": cfg.ignore_eos, "top_k": cfg.top_k}
    kw: dict[str, Any] = dict(model=model_id, messages=request.messages(cfg),
                              max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                              top_p=cfg.top_p, extra_body=extra)
    if cfg.temperature > 0:
        kw["seed"] = cfg.seed
    return kw


def outcome_from_response(resp: dict, cfg: RunConfig, effective: dict,
                          detokenize=None) -> request.Outcome:
    """A client-side ``Outcome`` from a chat-completion response (``Server.chat``)."""
    choice = resp["choices"][0]
    msg = choice.get("message") or {}
    usage = resp.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    prompt = list(resp.get("prompt_token_ids") or [])
    output = [int(t) for t in (choice.get("token_ids") or [])]
    markers = Markers.of(effective)
    j = judge(prompt, output, cfg.budget, markers)
    first = output[0] if output else None
    detok = detokenize or (lambda ids: None)
    reasoning = msg.get("reasoning") or msg.get("reasoning_content")
    return request.Outcome(
        request_id=resp.get("id"), budget=cfg.budget, max_tokens=cfg.max_tokens,
        prompt_tail=prompt[-4:], token_ids=output, text=detok(output) if output else "",
        finish_reason=choice.get("finish_reason"),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        reasoning_tokens=details.get("reasoning_tokens"), reasoning=reasoning,
        content=msg.get("content"), first_token=first,
        first_token_text=detok([first]) if first is not None else None,
        end_token_ids=list(markers.end), expected_end_index=j.expected_end_index,
        actual_end_index=j.actual_end_index, honored=j.honored,
        extra={"mode": "server", "usage": usage, "prompt_len": len(prompt),
               "token_ids_returned": choice.get("token_ids") is not None})


def check_a(server: Server, cfg: RunConfig, budgets=(1, 0)) -> list[request.Outcome]:
    """Brief §6 A through the server: greedy, budgets 1 and 0, ``</think>`` first."""
    eff = server.worker_effective()
    out = []
    for b in budgets:
        c = cfg.replace(thinking_token_budget=b, max_tokens=8)
        out.append(outcome_from_response(server.chat(c), c, eff, server.detokenize))
    return out


def await_trace(server: Server, before: set, n_tokens: int, timeout: float = 15.0) -> dict:
    """The trace of the requests sent since ``before``, once it holds ``n_tokens`` tokens.

    The plugin flushes after every step, before the step's tokens leave the engine, so this
    normally returns at once; the wait only covers a file system that lags.
    """
    deadline = time.monotonic() + timeout
    while True:
        frames = server.frames()
        mine = traced_req_ids(frames) - before
        reqs = frames["requests"]
        done = sum(len(e) for e in reqs.loc[reqs["req_id"].isin(mine), "emitted"]
                   if e is not None)
        if (mine and done >= n_tokens) or time.monotonic() > deadline:
            return _only(frames, mine)
        time.sleep(0.25)


def _only(frames: dict, req_ids: set) -> dict:
    """Keep the rows of the requests in ``req_ids``, the steps they ran in, tracer errors."""
    out = {}
    for name, df in frames.items():
        out[name] = df[df["req_id"].isin(req_ids)].reset_index(drop=True) \
            if "req_id" in getattr(df, "columns", ()) else df
    steps, reqs = out.get("steps"), out.get("requests")
    if steps is not None and reqs is not None and "pid" in steps.columns \
            and "pid" in reqs.columns:
        ran = set(zip(reqs["pid"], reqs["step"]))
        keep = [(p, st) in ran or st < 0 for p, st in zip(steps["pid"], steps["step"])]
        out["steps"] = steps[keep].reset_index(drop=True)
    return out


def effective(server: Server, wait_s: float = 10.0) -> dict:
    """The worker's effective configuration plus what only the front-end knows (argv, dropped
    flags, the runner-choice lines of the server log)."""
    eff = dict(server.worker_effective(wait_s))
    eff["mode"] = "server"
    eff["server_argv"] = server.argv
    eff["server_flags_dropped"] = server.dropped_flags
    eff["log_lines"] = veff.log_lines_of(server.log_path)
    eff["v1_fallback_logged"] = veff.v1_fallback_logged(eff["log_lines"])
    return eff


def check_compatible(server: Server, cfg: RunConfig) -> None:
    """A reused server must run ``cfg``'s engine and hooks (only request fields may differ)."""
    if not server.running:
        raise ServerError("the server passed to run() is not running", server.log_tail())
    ours, _ = server_args(cfg)
    theirs, _ = server_args(server.cfg)
    hooks = lambda c: wenv.hook_env(c, trace_dir="-")  # noqa: E731
    if ours != theirs or hooks(cfg) != hooks(server.cfg) or \
            wenv.vllm_env(cfg, cpu=False) != wenv.vllm_env(server.cfg, cpu=False):
        raise ConfigError("the server passed to run() was started for another engine "
                          "configuration (flags, fault, guard, trace or runner differ)")
