"""The reported request through vLLM's OpenAI-compatible server, exactly as #54906 was reported.

``run(cfg, outdir, res)`` (``investigate.run`` with ``cfg.mode == "server"``):

1. starts ``python -m vllm.entrypoints.openai.api_server`` as a subprocess in its own process
   group, bound to 127.0.0.1 on a free port (or the caller's port, refused up front if taken),
   with flags built from ``engine.engine_kwargs(cfg)`` (``server_args``) and the environment
   ``os.environ`` + ``engine.base_env(cfg, multiprocess=True)`` + ``runtime.env_for(cfg, ...)``
   (``server_env``); its stdout/stderr go to ``server.log``;
2. waits for ``/health`` and ``/v1/models`` (``ServerDied`` / ``StartupTimeout`` carry the log
   tail);
3. sends the issue's chat completion with the OpenAI client (``chat_kwargs``): budget,
   ``chat_template_kwargs`` ``{enable_thinking, preserve_thinking}``, ``return_token_ids``, ...;
   a 4xx answer raises ``RequestRejected`` with the server's message, after the run is recorded;
4. turns the response into ``request.Outcome`` (``outcome_from_response``: finish_reason,
   usage.completion_tokens, usage.completion_tokens_details.reasoning_tokens, content,
   reasoning, token ids, judged with ``request.judge``);
5. reads what vLLM's processes wrote through the ``workbook.plugin`` entry point: the
   per-process traces (flushed after every step, merged with ``workbook.trace.load``) and the
   worker's ``effective.json`` (``runtime.worker_effective``), adds the runner-choice lines of
   the server log, and runs ``diagnose``;
6. writes the evidence files of ``investigate.run`` (``config.json``, ``effective.json``,
   ``outcome.json``, ``checks.json``, ``verdict.json``, ``trace/``, ``timings.json``) plus
   ``server.log`` and the raw per-process traces in ``server_trace/<pid>/``;
7. stops the server (SIGINT, then SIGTERM, then SIGKILL to its process group) on success, on
   failure and on KeyboardInterrupt.

A ``Server`` can be kept up and reused for several requests (``run(..., server=srv)``): each
run then reads only the traces of the requests it sent.

Not here: hooks themselves (installed inside vLLM by ``workbook.plugin`` / ``workbook.runtime``),
check B (it edits model weights in the engine process: in-process only), streaming, more than
one server per call, and anything not on 127.0.0.1.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from workbook import engine, request, runtime
from workbook.config import ConfigError, RunConfig

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
        self.result = None
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


def server_env(cfg: RunConfig, worker_dir: str) -> dict[str, str]:
    """The server's environment: ours + what vLLM must see + what the workbook plugin reads."""
    env = dict(os.environ)
    for k, v in engine.base_env(cfg, multiprocess=True).items():
        if k == "VLLM_TRITON_FORCE_FIRST_CONFIG":
            env.setdefault(k, v)
        else:
            env[k] = v
    if cfg.runner == "auto":
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    if cfg.fault == "H-h":  # as engine.prepare_process: a V2 run silently served by V1
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    env.update(runtime.env_for(cfg, worker_dir))
    env["WORKBOOK_EFFECTIVE_DIR"] = worker_dir
    env["WORKBOOK_TRACE_FLUSH_EVERY"] = "1"  # the engine process is killed at shutdown
    env["PYTHONUNBUFFERED"] = "1"
    return env


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
                 startup_timeout: float = STARTUP_TIMEOUT_S, python: str | None = None):
        self.cfg = cfg
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
                                         env=server_env(self.cfg, self.worker_dir),
                                         start_new_session=True)
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
        """Merged per-process traces (``workbook.trace.load``); the runner's ``meta`` first."""
        from workbook.trace import load

        return _runner_meta_first(load(self.worker_dir))

    def log_lines(self) -> list[str]:
        """Server-log lines telling which runner / backend / fallback vLLM chose."""
        keys = engine._LogCapture.KEYS
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [ln.rstrip("\n")[:500] for ln in f if any(k in ln for k in keys)]
        except OSError:
            return []
        return lines[:200]


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


def _runner_meta_first(frames: dict) -> dict:
    """Order ``meta`` rows so the process that saw a model runner (markers known) comes first.

    Every vLLM process loads the plugin and traces; only the engine's has a runner, and
    ``store.markers`` reads the first ``meta`` row.
    """
    meta = frames.get("meta")
    if meta is None or len(meta) < 2 or "markers" not in meta.columns:
        return frames
    known = meta["markers"].map(lambda m: "end" in (json.loads(m) if isinstance(m, str)
                                                    else (m or {})))
    frames["meta"] = meta.iloc[(~known).argsort(kind="stable")].reset_index(drop=True)
    return frames


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
    start_ids, end_ids = request.marker_ids(effective)
    exp, act, honored = request.judge(prompt, output, cfg.budget, start_ids, end_ids,
                                      cfg.max_tokens)
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
        end_token_ids=end_ids, expected_end_index=exp, actual_end_index=act, honored=honored,
        extra={"mode": "server", "usage": usage, "prompt_len": len(prompt),
               "token_ids_returned": choice.get("token_ids") is not None})


# --- one run ------------------------------------------------------------------------------------------

def run(cfg: RunConfig, outdir: str | None, res, *, checks: tuple[str, ...] = (),
        server: Server | None = None, port: int | None = None):
    """Fill ``res`` (an ``investigate.Result``) by running ``cfg`` through the OpenAI server.

    With ``server`` (started, same engine configuration) it is reused and left running;
    otherwise one is started in ``outdir`` (or a temporary folder) and stopped at the end.
    """
    from workbook import diagnose

    if "B" in checks:
        raise ConfigError("check B edits the model weights inside the engine: run it with "
                          "mode='in-process'")
    own = server is None
    if own:
        server = Server(cfg, outdir, port=port)
    else:
        _check_compatible(server, cfg)
    t0 = time.perf_counter()
    try:
        if own:
            server.start()
        res.timings.update(server.timings)
        res.engine = None if own else server
        before = traced_req_ids(server.frames())
        t1 = time.perf_counter()
        try:
            resp = server.chat(cfg)
        except RequestRejected as e:
            _record_rejection(res, server, e)
            raise
        res.timings["generate_s"] = time.perf_counter() - t1
        res.effective = _effective(server)
        _save(res, "effective.json", res.effective)
        res.outcomes = [outcome_from_response(resp, cfg, res.effective, server.detokenize)]
        _save(res, "outcome.json", [o.to_dict() for o in res.outcomes])
        if cfg.trace:
            mrv2 = res.effective.get("runner_is_v2") is not False  # else nothing to wait for
            res.frames = await_trace(server, before, res.outcomes[0].completion_tokens,
                                     timeout=15.0 if mrv2 else 0.0)
            _save_frames(res)
        for name in checks:
            res.checks[name] = [o.to_dict() for o in check_a(server, cfg)]
            _save(res, "checks.json", res.checks)
        res.verdict = diagnose.diagnose(res.frames, res.effective, res.outcomes, cfg)
        _save(res, "verdict.json", res.verdict)
    finally:
        if own:
            server.stop()
        res.timings.update(server.timings)
        res.timings["total_s"] = time.perf_counter() - t0
        _save(res, "timings.json", res.timings)
        _copy_log(server, outdir)
    return res


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


def _effective(server: Server) -> dict:
    eff = dict(server.worker_effective())
    eff["mode"] = "server"
    eff["server_argv"] = server.argv
    eff["server_flags_dropped"] = server.dropped_flags
    eff["log_lines"] = server.log_lines()
    eff["v1_fallback_logged"] = any("V1" in line and ("fall" in line.lower()
                                                       or "not support" in line.lower())
                                    for line in eff["log_lines"])
    return eff


def _check_compatible(server: Server, cfg: RunConfig) -> None:
    """A reused server must run ``cfg``'s engine and hooks (only request fields may differ)."""
    if not server.running:
        raise ServerError("the server passed to run() is not running", server.log_tail())
    ours, _ = server_args(cfg)
    theirs, _ = server_args(server.cfg)
    hooks = lambda c: runtime.env_for(c, "-")  # noqa: E731
    if ours != theirs or hooks(cfg) != hooks(server.cfg) or cfg.runner != server.cfg.runner:
        raise ConfigError("the server passed to run() was started for another engine "
                          "configuration (flags, fault, guard, trace or runner differ)")


def _record_rejection(res, server: Server, e: RequestRejected) -> None:
    err = {"status": e.status, "message": e.server_message, "type": type(e).__name__}
    res.effective = _effective(server)
    _save(res, "effective.json", res.effective)
    res.outcomes = []
    _save(res, "outcome.json", {"error": err})
    res.verdict = {"verdict": "inconclusive", "hypothesis": None, "error": err,
                   "summary": f"the server rejected the request (HTTP {e.status}): "
                              f"{e.server_message}"}
    _save(res, "verdict.json", res.verdict)
    e.result = res


def _save(res, name: str, obj) -> None:
    if res.outdir:
        from workbook.investigate import write_json

        write_json(os.path.join(res.outdir, name), obj)


def _save_frames(res) -> None:
    if res.outdir and res.frames:
        from workbook.trace import store

        store.save({k: v for k, v in res.frames.items()}, os.path.join(res.outdir, "trace"))


def _copy_log(server: Server, outdir: str | None) -> None:
    if not outdir or not os.path.exists(server.log_path):
        return
    dst = os.path.join(outdir, "server.log")
    if os.path.abspath(dst) != os.path.abspath(server.log_path):
        shutil.copyfile(server.log_path, dst)
