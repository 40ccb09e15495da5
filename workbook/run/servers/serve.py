"""``workbook serve``: one environment run's model behind ``vllm serve``, until Ctrl-C.

Starts the OpenAI-compatible server of ``workbook.run.server`` (``Server``: the flags of
``engine.engine_kwargs`` — for a tiny model its folder, ``--load-format dummy``, the reasoning
parser, ``--kv-cache-memory-bytes`` — and the environment of ``workbook.vllm.env``: on a CPU
``WORKBOOK_TRITON_CPU=1`` so MRV2's Triton kernels run), with ``--logprobs-mode
processed_logprobs`` unless told otherwise (so ``workbook check-server`` sees the column the
budget forced), on 127.0.0.1:``port``. Once it answers it prints the URL, the matching
``check-server`` line, the equivalent stand-alone ``vllm serve`` command and the log's path,
then waits. Ctrl-C, SIGTERM or SIGHUP stop the server's whole process group
(``Server.stop``: SIGINT, SIGTERM, then SIGKILL) and return 0; a server that dies on its own
returns 1 with its log's last lines.

Not here: choosing the run (the CLI reads the environment through ``workbook.batch``), tracing
(the server runs the run's fault and guard, never the tracer), anything not on 127.0.0.1.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time

from workbook.core.config import RunConfig, validate
from workbook.run import server
from workbook.vllm import env as wenv

DEFAULT_PORT = 8000
SHOWN_ENV = (wenv.TRITON_CPU, "VLLM_USE_V2_MODEL_RUNNER", wenv.FAULT, wenv.GUARD)


def server_config(cfg: RunConfig, logprobs_mode: str = "processed_logprobs") -> RunConfig:
    """``cfg`` as a served configuration: mode server, no tracer, the logprobs mode set."""
    kw = dict(cfg.engine_kwargs)
    kw["logprobs_mode"] = logprobs_mode
    return validate(cfg.replace(mode="server", trace=False, engine_kwargs=kw))


def _here(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def vllm_command(srv: server.Server, python: str | None = None) -> str:
    """The stand-alone command that starts the same server: ``VARS vllm serve MODEL FLAGS``."""
    flags = list(srv.argv[3:])  # after: python -m vllm.entrypoints.openai.api_server
    model = ""
    if "--model" in flags:
        i = flags.index("--model")
        model = flags[i + 1]
        del flags[i:i + 2]
    env = {**wenv.vllm_env(srv.cfg, multiprocess=True), **wenv.hook_env(srv.cfg)}
    shown = [f"{k}={env[k]}" for k in SHOWN_ENV if env.get(k)]
    exe = _here(os.path.join(os.path.dirname(python or sys.executable), "vllm"))
    return " ".join(shown + [exe, "serve", shlex.quote(model)] + [shlex.quote(f) for f in flags])


def check_server_command(srv: server.Server, python: str | None = None) -> str:
    exe = _here(os.path.join(os.path.dirname(python or sys.executable), "workbook"))
    return f"{exe} check-server {srv.base_url}"


def serve(cfg: RunConfig, *, port: int | None = DEFAULT_PORT, workdir: str | None = None,
          label: str = "", out=print) -> int:
    """Run the server for ``cfg`` (already ``server_config``'d) until a signal; 0 stopped by
    the user, 1 the server died, 2 it could not start (port taken, start-up failed)."""
    if port:
        try:
            server.check_port(port)
        except server.PortBusy:
            out(f"workbook serve: port {port} on {server.HOST} is already in use; pass --port N "
                "(--port 0: a free one)", file=sys.stderr)
            return 2
    srv = server.Server(cfg, workdir, port=port)
    out(f"workbook serve: starting vllm serve for {label or cfg.model} on "
        f"{server.HOST}:{port or 'a free port'} (log: {srv.log_path}); this takes 1-3 "
        "minutes on a CPU", flush=True)

    def stop_on(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGINT too: a process started in the background by a shell inherits it ignored
    old = {s: signal.signal(s, stop_on) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            srv.start()
        except server.ServerError as e:
            out(f"workbook serve: {str(e).splitlines()[0]}", file=sys.stderr)
            tail = e.log_tail.strip().splitlines()[-15:]
            if tail:
                out("\n".join(tail), file=sys.stderr)
            return 2
        out(f"serving {srv.model_id} at {srv.base_url}  (OpenAI API: {srv.base_url}/v1; "
            f"vllm serve pid {srv.pid}; Ctrl-C stops it)")
        out(f"check it:   {check_server_command(srv)}")
        out(f"the same server without the workbook's launcher:\n  {vllm_command(srv)}")
        out(f"log: {srv.log_path}", flush=True)
        while srv.running:
            time.sleep(0.5)
        code = srv.proc.returncode if srv.proc is not None else "unknown"
        out(f"workbook serve: the server exited on its own (code {code}); its log's last "
            f"lines:\n{srv.log_tail(15)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        out("workbook serve: stopping the server (its whole process group) ...", flush=True)
        srv.stop()
        out(f"workbook serve: stopped (pid {srv.pid}); log: {srv.log_path}", flush=True)
        return 0
    finally:
        srv.stop()
        for s, h in old.items():
            signal.signal(s, h)
