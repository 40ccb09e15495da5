"""The HTML report is self-contained: opened in headless Chromium with networking blocked, it
requests nothing but ``file:`` and ``data:`` URLs, logs no console error, and its interactive
tables are built (DataTables initialised) in the DOM.

The report is built from a real batch (``workbook run`` on a tiny environment: MTP on and off,
real engine, real trace), then opened through the Chrome DevTools protocol: every request the
page makes (``Network.requestWillBeSent``), every console message and uncaught exception is
recorded. Host names resolve to nothing (``--host-resolver-rules``) and a dead proxy catches IP
literals, so a regression fails twice: in the request log and as a console error.

Chromium is Debian's ``chromium`` package; it is installed with apt-get when missing
(``setup.sh --tests`` does it too). About 3 minutes on a 2-core machine (two engine starts).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ALLOWED_SCHEMES = ("file:", "data:")


def workbook(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbook.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env,
                       capture_output=True, timeout=900)
        found = shutil.which("chromium")
    assert found, "Debian's chromium is needed (apt-get install chromium)"
    return found


class Browser:
    """Headless Chromium driven through the DevTools protocol (one page)."""

    def __init__(self, binary: str):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="wb-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             "--disable-features=Translate,OptimizationHints,MediaRouter",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--proxy-server=http://127.0.0.1:9", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.events: list[dict] = []
        self._id = 0
        for method in ("Network.enable", "Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)

    def _port(self) -> int:
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(path):
                text = open(path).read().split()
                if text:
                    return int(text[0])
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                assert "error" not in msg, msg
                return msg["result"]
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float) -> None:
        import websocket

        deadline = time.time() + timeout
        while time.time() < deadline:
            self.ws.settimeout(max(0.1, deadline - time.time()))
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                break
            self.events.append(msg)
            if msg.get("method") == method:
                self.ws.settimeout(60)
                return
        self.ws.settimeout(60)
        raise TimeoutError(method)

    def settle(self, seconds: float) -> None:
        import websocket

        self.ws.settimeout(0.2)
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                pass
        self.ws.settimeout(60)

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        return res["result"].get("value")

    def of(self, method: str) -> list[dict]:
        return [e["params"] for e in self.events if e.get("method") == method]

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    env = {"hardware": "report-cpu", "notebook": "notebooks/01_reproduce.py", "timeout": 420,
           "defaults": {"model": "tiny-mimo-mtp", "max_tokens": 8},
           "runs": [{"name": "mtp", "spec_method": "mtp"}, {"name": "no-spec",
                                                             "spec_method": "none"}]}
    (tmp / "env.yaml").write_text(yaml.safe_dump(env))
    res = workbook("run", tmp / "env.yaml", "--out", tmp / "outputs", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    (d,) = list((tmp / "outputs" / "report-cpu").iterdir())
    return d


@pytest.fixture(scope="module")
def report(run_dir) -> Path:
    res = workbook("report", "--out", run_dir.parent.parent)  # default: latest run per hardware
    assert res.returncode == 0, res.stderr[-3000:]
    path = Path(res.stdout.strip())
    assert path.is_file() and path.parent == run_dir.parent.parent / "reports"
    return path


def test_report_is_one_file_with_embedded_assets(report):
    text = report.read_text()
    assert "<script src=" not in text and "<link " not in text
    assert 'src="http' not in text and "require.js" not in text and "MathJax" not in text
    assert text.count('<img alt="') >= 2 and 'src="data:image/png;base64,' in text


def test_report_opens_offline_without_requests_or_errors(report, run_dir):
    browser = Browser(chromium_binary())
    try:
        browser.call("Page.navigate", url=report.resolve().as_uri())
        browser.wait_event("Page.loadEventFired", timeout=120)
        n_tables = report.read_text().count('<table id="wbtable')
        deadline = time.time() + 60
        while time.time() < deadline:  # itables initialises asynchronously (module import)
            if browser.evaluate("document.querySelectorAll('table.dataTable').length") == n_tables:
                break
            browser.settle(0.5)
        browser.settle(2.0)
        dom = browser.evaluate("""JSON.stringify({
            datatables: document.querySelectorAll('table.dataTable').length,
            headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
            text: document.body.innerText,
            images: [...document.images].map(i => [i.src.slice(0, 22), i.naturalWidth])})""")
    finally:
        browser.close()
    dom = json.loads(dom)

    urls = [r["request"]["url"] for r in browser.of("Network.requestWillBeSent")]
    assert urls and urls[0].startswith("file:")
    assert [u for u in urls if not u.startswith(ALLOWED_SCHEMES)] == []
    assert browser.of("Network.loadingFailed") == []
    assert browser.of("Runtime.exceptionThrown") == []
    console_errors = [c for c in browser.of("Runtime.consoleAPICalled")
                      if c["type"] in ("error", "assert")]
    assert console_errors == []
    assert [e for e in browser.of("Log.entryAdded") if e["entry"]["level"] == "error"] == []

    assert n_tables >= 4 and dom["datatables"] == n_tables
    assert {"Verdicts", "Failures", "First divergence between runs"} <= set(dom["headings"])
    for name in ("mtp", "no-spec", run_dir.name):
        assert name in dom["text"]
    assert "honored" in dom["text"] or "violated" in dom["text"]
    assert dom["images"] and all(src.startswith("data:image/png") and w > 0
                                 for src, w in dom["images"])


def test_report_compares_the_two_runs_from_the_trace(run_dir):
    from workbook.report import html as rep

    batch = rep.load_batch(str(run_dir))
    ((a, b),) = rep.pairs(batch.runs)
    assert (a.row["name"], b.row["name"]) == ("mtp", "no-spec")
    first, table = rep.divergence(a, b)
    assert table["path A"].notna().all() and table["path B"].notna().all()
    assert set(table["path B"]) == {"Sampler"}  # no drafts without speculation
    assert table["emitted A"].tolist()[:8] == a.outcome["token_ids"][:8]
    if first is not None:
        assert not table["same"].iloc[first]
