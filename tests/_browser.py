"""Headless Chromium driven through the DevTools protocol, for the browser tests.

``Browser(binary, offline=True)``: one page; every request (``Network.requestWillBeSent``),
console message and uncaught exception is recorded in ``events``. ``offline``: host names
resolve to nothing and a dead proxy catches IP literals (only 127.0.0.1 is reachable, for a
local JupyterLab). Also: ``screenshot(path)``, ``click(selector, count)`` (real mouse events at
the element's centre), ``wait_for(js, timeout)``.

Chromium is Debian's ``chromium`` package (``setup.sh --tests``); ``chromium_binary()``
installs it with apt-get when missing and running as root.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request


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
    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="wb-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             "--hide-scrollbars", f"--window-size={width},{height}",
             "--disable-features=Translate,OptimizationHints,MediaRouter",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--proxy-server=http://127.0.0.1:9",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.events: list[dict] = []
        self._id = 0
        for method in ("Network.enable", "Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

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
        if "exceptionDetails" in res:
            raise RuntimeError(res["exceptionDetails"])
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float, every: float = 0.5):
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self.settle(every)
        raise TimeoutError(expression)

    def click(self, selector: str, count: int = 1) -> None:
        """Real mouse events (``count`` 2: a double-click) at the element's centre."""
        box = self.evaluate(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}});
            const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2];
            }})()""")
        assert box, f"nothing matches {selector}"
        x, y = box
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for i in range(1, count + 1):
            self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y,
                      button="left", clickCount=i)
            self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y,
                      button="left", clickCount=i)

    def screenshot(self, path: str, full_page: bool = False) -> str:
        params = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, "
                                 "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": size[1],
                                "scale": 1})
        data = self.call("Page.captureScreenshot", **params)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

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
