"""``workbook check-server``: a running ``vllm serve`` judged from its OpenAI endpoint alone.

Each server is the real ``python -m vllm.entrypoints.openai.api_server`` (``workbook.run.server``)
on the tiny dense MTP model (``tiny-mimo-mtp``, MRV2, MTP k=4), without the workbook's tracer;
faults are injected into the server's own worker by the plugin (``WORKBOOK_FAULT``), which the
check never touches. The check is the CLI (``workbook check-server URL``), in its own process.

- healthy, started by ``workbook serve`` (``--logprobs-mode processed_logprobs``): honored, the
  forced column seen at position 0; markers that are not the server's (``--marker-ids``,
  ``--end``) are a wrong setting, exit 2 with the server's values; Ctrl-C stops the server;
- fault H-i (the reporter's state: marker ids zeroed on the device), ``processed_logits``:
  violated at position 0, "not forced";
- fault H-k (end token replaced after sampling), ``processed_logprobs``: violated at position 0;
  the server returns no logprobs for a token its sampler did not score, so the position says
  "not emitted, and no logprobs for the emitted token" (the in-process equivalent, which sees
  the sampler's own logprobs, says "forced, not emitted": ``scripts/version_check.py``);
- healthy with the default raw logprobs: judged from the tokens only, with the message saying so;
- no server at the URL / an unknown model: a clear message, exit 2, no traceback.

A server start costs 40-170 s on a loaded 2-core machine.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from workbook.core.budget import Markers
from workbook.core.config import RunConfig
from workbook.run import server
from workbook.run.servers import check as servercheck

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "workbook.cli", "check-server", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def _serve_and_check(tmp_path, logprobs_mode: str | None, fault: str = "none"):
    kw = {"logprobs_mode": logprobs_mode} if logprobs_mode else {}
    cfg = RunConfig(mode="server", trace=False, fault=fault, engine_kwargs=kw)
    out = str(tmp_path / "check.json")
    with server.Server(cfg, str(tmp_path / "server")) as srv:
        if logprobs_mode:
            assert "--logprobs-mode" in srv.argv and logprobs_mode in srv.argv
        proc = _cli(srv.base_url, "--json", out)
        eff = server.effective(srv)
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    res = json.load(open(out))
    return proc, res, Markers.of(eff)


class Serve:
    """``workbook serve cpu --only reported-mtp`` in its own process group, its lines read by a
    thread (the user's command: it prints the URL and the check-server line, stops on Ctrl-C)."""

    def __init__(self, tmp_path, timeout=900):
        self.work = tmp_path / "serve"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workbook.cli", "serve", "cpu", "--only", "reported-mtp",
             "--port", str(server.free_port()), "--workdir", str(self.work)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": REPO}, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout] and None,
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        while not any(x.startswith("log: ") for x in self.seen):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.text
            try:
                self.seen.append(self.lines.get(timeout=1).rstrip("\n"))
            except queue.Empty:
                pass
        serving = next(x for x in self.seen if x.startswith("serving "))
        self.url = re.search(r" at (http://\S+)", serving).group(1)
        self.pid = int(re.search(r"vllm serve pid (\d+)", serving).group(1))

    @property
    def text(self) -> str:
        return "\n".join(self.seen)

    def effective(self) -> dict:
        found = [json.load(open(p)) for p in
                 glob.glob(str(self.work / "server_trace" / "*" / "effective.json"))]
        return next((e for e in found if "runner_class" in e), found[0] if found else {})

    def interrupt(self) -> int:
        os.kill(self.proc.pid, signal.SIGINT)  # Ctrl-C
        rc = self.proc.wait(timeout=120)
        while True:
            try:
                self.seen.append(self.lines.get(timeout=2).rstrip("\n"))
            except queue.Empty:
                return rc


def test_serve_then_check_healthy_and_wrong_markers(tmp_path):
    """``workbook serve`` (the tiny model on CPU, processed logprobs) + check-server: honored;
    markers that are not the server's are a wrong setting (exit 2, the server's values), never
    "violated"; Ctrl-C stops the server's whole process group."""
    srv = Serve(tmp_path)
    try:
        assert f"check-server {srv.url}" in srv.text and " serve " in srv.text, srv.text
        assert "--load-format dummy" in srv.text and "--reasoning-parser qwen3" in srv.text
        assert "--logprobs-mode processed_logprobs" in srv.text
        out = str(tmp_path / "check.json")
        proc = _cli(srv.url, "--json", out)
        wrong_ids = _cli(srv.url, "--marker-ids", "248068/248069")
        wrong_end = _cli(srv.url, "--end", "</reason>")
        cons_out = str(tmp_path / "constraints.json")
        cons = _cli(srv.url, "--constraints", "thinking_token_budget,stop,max_tokens,logit_bias,"
                    "penalties,structured_output", "--json", cons_out)
        cons_wrong = _cli(srv.url, "--constraints", "thinking_token_budget", "--marker-ids",
                          "248068/248069")
        markers = Markers.of(srv.effective())
    finally:
        rc = srv.interrupt()
    assert rc == 0 and "stopped" in srv.text, srv.text
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.pid, 0)  # no orphan: the server's process group is gone
    res = json.load(open(out))
    _healthy(proc, res, markers)
    end = ",".join(map(str, markers.end))
    for bad in (wrong_ids, wrong_end):
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "violated" not in bad.stdout + bad.stderr and "Traceback" not in bad.stderr
        line = bad.stderr.strip()
        assert len(line.splitlines()) == 1 and "are not the server's" in line
        assert f"the server forced {end} (" in line and f"as {end}, and" in line, line
    assert "start 248068, end 248069" in wrong_ids.stderr
    _constraints(cons, json.load(open(cons_out)), cons_wrong)


def _constraints(proc, res, wrong):
    """``--constraints`` on the healthy server: a verdict per case from what it returned; the
    budget's markers given wrong are a wrong setting (exit 2), never "violated"."""
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    got = {v["case"]: v for v in res["verdicts"]}
    assert list(got) == ["thinking_token_budget", "logit_bias", "penalties", "stop",
                         "max_tokens", "structured_output"]
    for case in ("thinking_token_budget", "stop", "max_tokens"):
        assert got[case]["status"] == "holds", got[case]
        assert "output" in got[case]["judged"]
    assert "the budget per position (processed_logprobs)" in \
        got["thinking_token_budget"]["judged"]
    # MRV2 0.32 refuses logit_bias with speculative decoding: the server's own message
    assert got["logit_bias"]["status"] in ("refused", "holds"), got["logit_bias"]
    if got["logit_bias"]["status"] == "refused":
        assert "HTTP 400" in got["logit_bias"]["message"]
    # processed logprobs: frequency and presence judged per position against one-token
    # controls on the same prefix; the repetition penalty (it scales logits) is said not judged
    pen = got["penalties"]
    assert pen["status"] == "holds", pen
    assert any(j.startswith("processed rows vs the control (processed_logprobs: ")
               for j in pen["judged"]), pen
    assert "not additive in log-probabilities" in pen["not_judged"]["repetition_penalty"]
    # the grammar: the returned tokens through xgrammar on the model's own tokenizer
    so = got["structured_output"]
    assert so["status"] == "holds", so
    assert "the output through the grammar (xgrammar, the model's tokenizer)" in so["judged"]
    assert "VERDICT: " in proc.stdout and "None" not in proc.stdout
    assert wrong.returncode == 2 and "WRONG SETTING" in wrong.stdout
    assert "VIOLATED" not in wrong.stdout and "are not the server's" in wrong.stdout


def _healthy(proc, res, markers):
    j = res["judged"]
    assert proc.returncode == 0 and res["verdict"] == "honored", proc.stdout
    assert res["mode"] == "processed_logprobs"
    assert res["mode_evidence"]["from"] == "a forced column in the response"
    assert j["markers"]["end"] == list(markers.end)  # /tokenize gave the engine's own ids
    assert j["prompt_reasoning_count"] == 1 and j["expected_end_index"] == 0
    p0 = j["positions"][0]
    assert p0["token"] == p0["due"] == p0["forced"] == markers.end[0]
    assert p0["status"] == "forced and emitted" and p0["top_value"] == 0.0
    # nothing forced where the budget does not bind
    assert all(p["forced"] is None for p in j["positions"][1:])
    assert "VERDICT: honored" in proc.stdout
    assert servercheck.CANNOT_TELL in proc.stdout


def test_fault_markers_zeroed_processed_logits(tmp_path):
    """H-i: the device markers read 0 — the kernel never forces (the reporter's symptom)."""
    proc, res, markers = _serve_and_check(tmp_path, "processed_logits", fault="H-i")
    j = res["judged"]
    assert proc.returncode == 1 and res["verdict"] == "violated", proc.stdout
    assert res["mode"] == "processed_logits"  # from the temperature control: nothing forced
    assert res["mode_evidence"]["from"].startswith("temperature control")
    fb = j["first_bad"]
    assert fb["index"] == 0 and fb["due"] == markers.end[0] and fb["token"] != markers.end[0]
    assert fb["forced"] is None and fb["status"].startswith("NOT FORCED")
    assert "VERDICT: violated at output position 0: NOT FORCED" in proc.stdout


def test_fault_after_the_bias_processed_logprobs(tmp_path):
    """H-k: the row is forced, the end token is replaced after sampling."""
    proc, res, markers = _serve_and_check(tmp_path, "processed_logprobs", fault="H-k")
    fb = res["judged"]["first_bad"]
    assert proc.returncode == 1 and res["verdict"] == "violated", proc.stdout
    assert fb["index"] == 0 and fb["due"] == markers.end[0] != fb["token"]
    assert fb["status"].startswith("NOT EMITTED, and no logprobs for the emitted token")
    # every later position stays due (reasoning never ended) and is judged the same way
    assert all(p["due"] == markers.end[0] and not p["ok"] for p in res["judged"]["positions"])


def test_raw_logprobs_server_is_judged_on_tokens_only(tmp_path):
    proc, res, markers = _serve_and_check(tmp_path, None)
    assert res["mode"] == "raw", res["mode_evidence"]
    assert res["verdict"] == "honored" and proc.returncode == 0
    assert res["judged"]["positions"][0]["forced"] is None
    assert servercheck.RAW_ONLY in proc.stdout


def test_unreachable_server_is_a_clear_error():
    proc = _cli("http://127.0.0.1:9", timeout=60)
    assert proc.returncode == 2
    assert "cannot reach a server at http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_marker_ids_are_a_clear_error():
    proc = _cli("http://127.0.0.1:9", "--marker-ids", "248068", timeout=60)
    assert proc.returncode == 2 and "--marker-ids wants START/END" in proc.stderr


@pytest.mark.parametrize("tops,mode,forced", [
    ({369: 0.0, 5: -9999.0, 7: -9999.0}, "processed_logprobs", 369),
    ({369: -0.5, 5: -1.2}, "processed_logprobs", None),
    ({369: 0.0}, "processed_logprobs", None),  # no runner-up returned: cannot tell
    ({369: 1e9, 5: 0.01}, "processed_logits", 369),
    ({369: 0.02, 5: 0.01}, "processed_logits", None),
])
def test_forced_column(tops, mode, forced):
    assert servercheck.forced_column(tops, mode) == forced


def test_forced_where_the_budget_does_not_bind_is_a_violation():
    m = Markers([10], [11])
    # budget 3, prompt count 1: due at index 2; a forced </think> at index 0 is premature
    j = servercheck.judge_positions([1, 10, 198], [11, 5, 6],
                                    [{11: 0.0, 5: -9999.0}, {5: -1.0, 6: -2.0},
                                     {6: -1.0, 5: -3.0}], 3, m, "processed_logprobs")
    assert j["verdict"] == "violated"
    assert j["first_bad"]["index"] == 0
    assert j["first_bad"]["status"] == "FORCED WHERE THE BUDGET DOES NOT BIND"


@pytest.mark.parametrize("given,prompt,output,tops,mode,evidence", [
    # the server forced its own </think> (11), the end given is 99: a wrong setting
    (Markers([10], [99]), [1, 10, 5], [11, 6], [{11: 0.0, 6: -9999.0}, {}],
     "processed_logprobs", "forced"),
    # the server forced the end given: the given markers are the server's (another parser)
    (Markers([10], [12]), [1, 10, 5], [12, 6], [{12: 0.0, 6: -9999.0}, {}],
     "processed_logprobs", None),
    # a third column forced: a defect whichever markers are right, judged with a note
    (Markers([10], [12]), [1, 10, 5], [13, 6], [{13: 0.0, 6: -9999.0}, {}],
     "processed_logprobs", "neither"),
    # a third column forced (a defect) and the start given not in the prompt: wrong setting
    (Markers([248068], [248069]), [1, 10, 5], [13, 6], [{13: 0.0, 6: -9999.0}, {}],
     "processed_logprobs", "prompt"),
    # raw: the server's start marker opens the prompt's reasoning, the given one is absent
    (Markers([248068], [248069]), [1, 10, 5], [11, 6], [{}, {}], "raw", "prompt"),
    # raw: same start; the output ends reasoning with the server's end, never the given one
    (Markers([10], [7, 8]), [1, 10, 5], [11, 6], [{}, {}], "raw", "output"),
])
def test_marker_mismatch(given, prompt, output, tops, mode, evidence):
    server_own = Markers([10], [11])
    found = servercheck.marker_mismatch(given, server_own, prompt, output, tops, mode)
    assert (found or {}).get("evidence") == evidence
    if found and evidence != "neither":
        line = servercheck.mismatch_line(given, server_own, found, {10: "<think>",
                                                                   11: "</think>"})
        assert "\n" not in line and "not the server's" in line
        assert "--marker-ids 10/11" in line and "None" not in line


def test_same_markers_are_never_a_mismatch():
    m = Markers([10], [11])
    assert servercheck.marker_mismatch(m, m, [10], [5], [{5: 0.0, 6: -9999.0}],
                                       "processed_logprobs") is None
