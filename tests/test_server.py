"""The reported request through vLLM's real OpenAI-compatible server (``workbook.run.server``), CPU.

Every test starts (or reuses) a real ``python -m vllm.entrypoints.openai.api_server`` on the tiny
dense MTP model (``tiny-mimo-mtp``, MRV2, MTP k=4) and sends the issue's chat request with the
OpenAI client. Only one engine of ours runs at a time: the healthy server serves the healthy and
the rejected request and is stopped before the in-process reference runs; each later test starts
and stops its own. A server start costs 40-170 s on a loaded 2-core machine.

Not here: in-process behaviour (tests/test_trace.py, tests/test_diagnose.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from workbook.core import models
from workbook.run import backends, pipeline, server
from workbook.core.config import RunConfig

CFG = RunConfig(mode="server")  # tiny-mimo-mtp, mtp k=4, runner v2, budget 1, max_tokens 32
EVIDENCE = ("config.json", "effective.json", "outcome.json", "verdict.json", "timings.json",
            "server.log")
LONG_PROMPT = "9 " * 1500  # > max_model_len (1024) tokens: the server must reject it


def _end_id(res) -> int:
    return res.effective["reasoning_end_token_ids"][0]


def _assert_evidence(outdir: str, traced: bool = True) -> None:
    for name in EVIDENCE:
        assert os.path.exists(os.path.join(outdir, name)), name
    if traced:
        for table in ("steps", "requests", "rows", "registrations"):
            assert os.path.exists(os.path.join(outdir, "trace", f"{table}.parquet")), table


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """One healthy server: the reported request, then a request it must reject; then stopped."""
    base = tmp_path_factory.mktemp("healthy")
    out = {"dir": str(base / "run"), "rejected_dir": str(base / "rejected")}
    srv = server.Server(CFG, str(base / "server"))
    with srv:
        out["pgid"] = srv.pid
        out["res"] = pipeline.run(CFG, out["dir"], backend=backends.Served(CFG, server=srv))
        try:
            pipeline.run(CFG.replace(prompt=LONG_PROMPT), out["rejected_dir"],
                         backend=backends.Served(CFG.replace(prompt=LONG_PROMPT), server=srv))
        except server.RequestRejected as e:
            out["rejected"] = e
        out["alive_after_reject"] = srv.running
    out["stopped"] = not server._group_alive(out["pgid"])
    return out


def test_healthy_request_honored_through_server(healthy):
    res = healthy["res"]
    o = res.outcome
    assert res.effective["runner_is_v2"] is True
    assert res.effective["thinking_budget_enabled"] is True
    assert res.effective["spec_method"] == "mtp"
    assert any("V2 Model Runner" in line for line in res.effective["log_lines"])
    assert o.extra["token_ids_returned"] is True
    assert o.first_token == _end_id(res)  # the known healthy answer: </think> first
    assert o.honored is True and o.expected_end_index == 0
    assert o.finish_reason == "length" and o.completion_tokens == len(o.token_ids) == 32
    assert o.reasoning_tokens == 0 and o.content  # usage.completion_tokens_details
    assert res.verdict["verdict"] == "honored"
    assert res.verdict["client_agrees"] is True  # the worker's trace == what the client saw
    regs = res.frames["registrations"]
    assert len(regs) == 1 and regs.iloc[0]["budget_param"] == 1
    assert set(res.frames["requests"]["path"]) >= {"RejectionSampler"}
    _assert_evidence(healthy["dir"])
    assert healthy["stopped"], "the server's process group outlived stop()"


def test_rejected_request_is_recorded(healthy):
    e = healthy.get("rejected")
    assert e is not None, "the over-long prompt was not rejected"
    assert e.status == 400
    assert "context length" in e.server_message or "too long" in e.server_message.lower()
    assert healthy["alive_after_reject"]  # a rejected request does not take the server down
    d = healthy["rejected_dir"]
    assert json.load(open(os.path.join(d, "outcome.json")))["error"]["status"] == 400
    verdict = json.load(open(os.path.join(d, "verdict.json")))
    assert verdict["verdict"] == "inconclusive" and verdict["error"]["status"] == 400


@pytest.mark.slow  # one more engine start (~40-80 s); deselect with -m "not slow"
def test_same_outcome_as_in_process(healthy, tmp_path):
    """Same configuration in-process (own interpreter: one in-process engine per process)."""
    outdir = str(tmp_path / "inproc")
    code = ("import sys; from workbook.run import pipeline; from workbook.core.config import RunConfig;"
            "pipeline.run(RunConfig(mode='in-process'), sys.argv[1])")
    proc = subprocess.run([sys.executable, "-c", code, outdir], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    inproc = json.load(open(os.path.join(outdir, "outcome.json")))[0]
    verdict = json.load(open(os.path.join(outdir, "verdict.json")))
    srv = healthy["res"]
    assert verdict["verdict"] == srv.verdict["verdict"] == "honored"
    assert inproc["token_ids"] == srv.outcome.token_ids
    assert inproc["finish_reason"] == srv.outcome.finish_reason
    assert inproc["first_token"] == srv.outcome.first_token


def test_fault_caught_from_server_side_trace(tmp_path):
    """H-c (budget never registered), injected inside the server's worker by the plugin."""
    res = pipeline.run(CFG.replace(fault="H-c"), str(tmp_path))
    assert res.outcome.honored is False and res.outcome.first_token != _end_id(res)
    assert res.outcome.reasoning_tokens == res.outcome.completion_tokens == 32  # as reported
    assert res.verdict["verdict"] == "violated"
    assert res.verdict["hypothesis"] == "H-c"
    reg = res.frames["registrations"].iloc[0]
    assert reg["budget_param"] == 1 and not reg["use_thinking_budget"]
    _assert_evidence(str(tmp_path))


def test_guard_fixes_fault_through_server(tmp_path):
    pytest.importorskip("workbook.hooks.guard")
    res = pipeline.run(CFG.replace(fault="H-c", guard=True), str(tmp_path))
    assert res.outcome.first_token == _end_id(res)
    assert res.outcome.honored is True
    assert res.verdict["verdict"] == "honored"
    assert res.frames["steps"]["guard_fixed"].fillna(0).sum() >= 1  # the guard did the forcing
    # the served worker's own guard report, per rank (its <pid>/guard.json), in the verdict
    g = res.verdict["guard"]
    assert g["available"] is True and g["rank"] == "pp0/tp0", g
    assert g["fixed_tokens"] >= 1 and g["agreement"]["agree"] is True


def test_port_busy_fails_before_starting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = server.Server(CFG, str(tmp_path), port=port)
        with pytest.raises(server.PortBusy, match=str(port)):
            srv.start()
    assert srv.proc is None and not os.path.exists(srv.log_path)


def test_server_dying_at_startup_reports_log_tail(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    src = models.build("tiny-mimo-mtp")
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), broken / name)
    (broken / "config.json").write_text('{"architectures": ["MiMoForCausalLM"], "model_type": ')
    outdir = str(tmp_path / "run")
    t0 = time.perf_counter()
    with pytest.raises(server.ServerDied) as info:
        pipeline.run(CFG.replace(model=str(broken)), outdir)
    assert "exited with code" in str(info.value)
    assert "server.log (last lines)" in str(info.value) and info.value.log_tail.strip()
    assert os.path.exists(os.path.join(outdir, "server.log"))
    assert os.path.exists(os.path.join(outdir, "timings.json"))
    assert time.perf_counter() - t0 < 300


def test_startup_timeout_stops_the_process_group(tmp_path):
    srv = server.Server(CFG, str(tmp_path), startup_timeout=3)
    with pytest.raises(server.StartupTimeout, match="not ready after 3 s"):
        srv.start()
    assert srv.proc is None and srv.pid is not None
    assert not server._group_alive(srv.pid), "the timed-out server's process group survived"
    assert open(srv.log_path).read().startswith(f"$ {sys.executable} -m {server.MODULE}")


def test_a_server_child_dies_with_its_killed_client(tmp_path):
    """A server is started in its own session (Ctrl-C in the client's terminal must not reach
    it; the client stops it) — so a client killed outright (SIGKILL: no atexit, no handler)
    would leave it running. ``die_with_parent`` (its ``preexec_fn``) makes the kernel send it
    SIGTERM when the client dies. Shown with the same ``Popen`` settings on a stand-in child
    (no engine): the client is SIGKILLed, the child is gone within seconds."""
    import signal

    pidfile = tmp_path / "child.pid"
    client = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from workbook.run import server\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True,\n"
        "                     preexec_fn=server.die_with_parent)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n")], cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pidfile.read_text())
        os.kill(child, 0)  # running
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            try:  # reap it if it became our zombie (it did not: init adopts it)
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the client's child outlived its SIGKILLed client")
    finally:
        if client.poll() is None:
            client.kill()
