"""JupyterLab as a new user meets it: double-click a notebook, run it, explore it, save it.

Starts this venv's ``jupyter lab`` on the repository (as root with ``--allow-root``, as the
README says; its user settings in a temporary folder with autosave off: the test saves once,
in step 4) and drives it with headless Chromium (``tests/_browser``):

1. in the file browser, ``notebooks/02_trace.py`` is double-clicked: it opens as a notebook
   (jupytext's default viewer, set by ``setup.sh``), not in the text editor, on the kernel
   "Python (workbook)";
2. Run All: the notebook runs end to end on a real engine (tiny CPU model) with no error; the
   engine-start cell shows one line about vLLM's start-up log, not the log;
3. the step explorer (a steps × rows grid of decoded tokens) is there; "later ▶" moves its
   window, and a click on a cell shows that row's details (the ``</think>`` logit before and
   after the bias);
4. Save (as a person would, with outputs in every cell): JupyterLab writes the pair through
   jupytext's contents manager and the save hook ``setup.sh`` installed
   (``workbook.report.nbclean``) — ``git status`` of ``notebooks/`` is clean and every file of
   the pair is byte-identical (should it not be, the test puts the bytes back and fails).

Screenshots are kept (``$WORKBOOK_TEST_ARTEFACTS`` or the test's tmp folder; paths printed).
About 2–3 minutes on a 2-core machine (one engine start).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _browser import Browser, chromium_binary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NOTEBOOK = "02_trace.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--", "notebooks"], cwd=REPO,
                          capture_output=True, text=True).stdout


def _snapshot() -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted((REPO / "notebooks").iterdir()) if p.is_file()}


def _digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((REPO / "notebooks").iterdir()) if p.is_file()}


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on the repository; yields its URL (token included)."""
    port, token = _free_port(), secrets.token_hex(16)
    settings = tmp_path / "user-settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    news = tmp_path / "user-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    cmd = [str(BIN / "jupyter"), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={REPO}",
           "--expose-app-in-browser"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
                assert time.time() < deadline, "jupyter lab did not start"
                time.sleep(1)
        yield url, token
    finally:
        from workbook.batch.executors import kill_tree

        kill_tree(proc.pid)  # the server and the kernels it started
        log.close()


def test_double_click_run_and_explore(lab, tmp_path):
    url, token = lab
    shots = Path(os.environ.get("WORKBOOK_TEST_ARTEFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    before = _digests()
    kept = _snapshot()
    status_before = _git_status()
    browser = Browser(chromium_binary(), width=1400, height=1000)
    try:
        browser.call("Page.navigate", url=f"{url}/lab/tree/notebooks?token={token}")
        browser.wait_for("window.jupyterapp && document.querySelectorAll("
                         "'.jp-DirListing-item').length > 3", timeout=180)
        target = browser.wait_for(f"""(() => {{
            for (const el of document.querySelectorAll('.jp-DirListing-item')) {{
              const name = el.querySelector('.jp-DirListing-itemText');
              if (name && name.textContent.trim() === {json.dumps(NOTEBOOK)}) {{
                el.setAttribute('data-wb-target', '1'); return true; }}
            }} return false; }})()""", timeout=60)
        assert target
        browser.click("[data-wb-target]", count=2)  # double-click, as a person would
        kind = browser.wait_for("""(() => {
            const w = window.jupyterapp.shell.currentWidget;
            if (!w || !w.context || !w.context.path.endsWith('02_trace.py')) return null;
            return w.hasClass('jp-NotebookPanel') ? 'notebook' :
                   (w.content && w.content.hasClass && w.content.hasClass('jp-FileEditor'))
                   ? 'editor' : 'other'; })()""", timeout=120)
        assert kind == "notebook", f"02_trace.py opened as {kind}, not as a notebook"
        kernel = browser.wait_for("""(() => { const s = window.jupyterapp.shell.currentWidget
            .sessionContext; return s && s.session && s.session.kernel &&
            s.kernelDisplayStatus === 'idle' ? s.kernelDisplayName : null; })()""",
                                  timeout=180)
        assert kernel == "Python (workbook)"
        browser.screenshot(str(shots / "lab-opened.png"))

        browser.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        state = browser.wait_for("""(() => {
            const w = window.jupyterapp.shell.currentWidget;
            const cells = [...w.content.widgets].filter(c => c.model.type === 'code');
            const running = cells.some(c => c.model.executionState === 'running' ||
                                             (c.promptNode && c.promptNode.textContent.includes('*')));
            const errors = cells.flatMap(c => c.model.outputs.toJSON())
                               .filter(o => o.output_type === 'error');
            if (errors.length) return {errors: errors.map(e => e.ename + ': ' + e.evalue)};
            const done = cells.every(c => c.model.executionCount !== null);
            return (!running && done) ? {done: true} : null; })()""", timeout=900, every=2.0)
        assert state == {"done": True}, state
        first = browser.evaluate("""(() => { const w = window.jupyterapp.shell.currentWidget;
            const cells = [...w.content.widgets].filter(c => c.model.type === 'code');
            return cells.map(c => c.model.outputs.toJSON().filter(o => o.output_type === 'stream')
                              .map(o => o.text).join('')); })()""")
        started = next(t for t in first if "engine started in" in t)
        assert "vllm.log" in started or "start-up log" in started
        assert all(t.count("INFO") < 3 for t in first), first

        grid = browser.wait_for("document.querySelectorAll('.wb-grid .wb-cell').length",
                                timeout=60)
        assert grid >= 8
        browser.evaluate("document.querySelector('.wb-grid').scrollIntoView({block: 'start'})")
        browser.settle(1.0)
        browser.screenshot(str(shots / "lab-explorer.png"))
        status0 = browser.evaluate("document.querySelector('.wb-status').innerText")
        browser.click(".wb-next button, button.wb-next")
        browser.wait_for(f"document.querySelector('.wb-status').innerText !== "
                         f"{json.dumps(status0)}", timeout=30)
        browser.click(".wb-jump button, button.wb-jump")
        browser.settle(1.0)
        browser.evaluate("""(() => { const b = [...document.querySelectorAll('.wb-cell')]
            .map(e => e.tagName === 'BUTTON' ? e : e.querySelector('button'))
            .find(b => b && !b.disabled && b.textContent.trim());
            b.setAttribute('data-wb-cell', '1'); })()""")
        browser.click("[data-wb-cell]")
        details = browser.wait_for("""(() => { const d = document.querySelector('.wb-details');
            const t = d ? d.innerText : ''; return t.includes('logit') ? t : null; })()""",
                                   timeout=30)
        assert "after the budget's bias" in details and "step" in details
        shot = browser.screenshot(str(shots / "lab-explorer-selected.png"))
        print(f"\nscreenshots: {shots / 'lab-opened.png'} {shots / 'lab-explorer.png'} {shot}")

        # 4. save, with every cell's outputs in the model
        outputs = browser.evaluate("""(() => { const w = window.jupyterapp.shell.currentWidget;
            return [...w.content.widgets].filter(c => c.model.type === 'code')
                .reduce((n, c) => n + c.model.outputs.length, 0); })()""")
        assert outputs > 5
        browser.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        saved = browser.wait_for("""(() => { const w = window.jupyterapp.shell.currentWidget;
            return w.context.model.dirty === false && w.context.contentsModel &&
                   w.context.contentsModel.last_modified ? w.context.contentsModel.last_modified
                   : null; })()""", timeout=120)
        assert saved
        browser.settle(2.0)
        exceptions = browser.of("Runtime.exceptionThrown")
    finally:
        browser.close()
        changed = [p for p, data in kept.items() if not p.exists() or p.read_bytes() != data]
        for p in changed:  # never leave the repository dirty, even when the test fails
            p.write_bytes(kept[p])
    assert exceptions == []
    assert not changed, f"saving in JupyterLab changed {[p.name for p in changed]} (is the " \
                        "save hook installed? `bash setup.sh`)"
    assert _git_status() == status_before
    assert _digests() == before, "the notebooks in the repository changed"
