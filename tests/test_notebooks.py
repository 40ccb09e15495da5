"""The notebooks as people open and run them.

- Every ``notebooks/*.py`` (jupytext percent, the source of truth) has a paired
  ``notebooks/*.ipynb`` without outputs, kept in sync by jupytext: this test fails when they
  drift (fix: ``.venv/bin/jupytext --sync notebooks/*.py``). The pair is what
  ``papermill notebooks/01_reproduce.ipynb out.ipynb -p ...`` and JupyterLab open.
- Both name the kernel ``workbook``, which ``setup.sh`` installs, with JupyterLab's setting
  that opens ``.py`` files as notebooks on double-click (jupytext's default viewer).
- ``papermill --help-notebook`` and ``workbook params`` list the parameters; papermill executes
  the paired notebook directly with ``-p`` (one real engine start, about a minute).
- Saving a notebook in JupyterLab leaves the repository clean: ``setup.sh`` installs the
  save hook (``workbook.report.nbclean``) into this venv's Jupyter server configuration, and a
  real Jupyter server (jupyter_server with jupytext's contents manager, configured from this
  venv's files as ``jupyter lab`` is) opens every notebook from its ``.py`` and its
  ``.ipynb``, gets a kernel's outputs and metadata, saves — and ``git status`` is clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
BIN = Path(sys.executable).parent
SYNC = ".venv/bin/jupytext --sync notebooks/*.py"
STRIP = ".venv/bin/python -m workbook.report.nbclean notebooks/*.ipynb"  # clears outputs


def _cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", [])))
            for c in nb.cells]


@pytest.mark.parametrize("py", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_paired_ipynb_is_in_sync_and_has_no_outputs(py):
    import jupytext

    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `{SYNC}`"
    text = jupytext.read(py)
    paired = nbformat.read(ipynb, as_version=4)
    assert text.metadata["jupytext"]["formats"] == "ipynb,py:percent", \
        f"{py.name}: the header must pair it (formats: ipynb,py:percent); then `{SYNC}`"
    assert _cells(text) == _cells(paired), f"{py.name} and {ipynb.name} drifted: run `{SYNC}`"
    for nb in (text, paired):
        assert nb.metadata["kernelspec"]["name"] == "workbook"
    for cell in paired.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, \
                f"{ipynb.name} holds outputs: clear them with `{STRIP}` (and `bash setup.sh` " \
                "installs the save hook that keeps JupyterLab from writing them)"


def test_setup_installs_the_kernel_and_the_default_viewer():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("workbook")  # setup.sh: ipykernel install
    assert Path(spec.argv[0]).parent.resolve() == BIN.resolve()
    overrides = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert overrides.exists(), "setup.sh writes JupyterLab's settings overrides"
    viewers = json.loads(overrides.read_text())["@jupyterlab/docmanager-extension:plugin"]
    assert viewers["defaultViewers"]["python"] == "Jupytext Notebook"


def test_setup_installs_the_save_hook():
    from workbook.report import nbclean

    path = Path(nbclean.server_config_path())
    assert path.exists(), f"{path} missing: `bash setup.sh` installs JupyterLab's save hook"
    config = json.loads(path.read_text())
    assert config["ContentsManager"]["pre_save_hook"] == \
        nbclean.SERVER_CONFIG["ContentsManager"]["pre_save_hook"]


def _as_a_kernel_leaves_it(nb: dict) -> None:
    """What running every cell in JupyterLab puts into a notebook model."""
    for i, cell in enumerate(nb["cells"]):
        cell["metadata"]["jupyter"] = {"outputs_hidden": False}
        if cell["cell_type"] != "code":
            continue
        cell["execution_count"] = i + 1
        cell["metadata"]["execution"] = {"iopub.execute_input": "2026-12-03T20:00:00Z"}
        cell["outputs"] = [
            {"output_type": "stream", "name": "stdout", "text": "engine started in 31 s\n"},
            {"output_type": "display_data", "metadata": {},
             "data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}},
            {"output_type": "execute_result", "execution_count": i + 1, "metadata": {},
             "data": {"text/plain": "   step  path"}}]
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.2"}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}


@pytest.mark.parametrize("opened", ["py", "ipynb"])
def test_saving_in_jupyter_leaves_the_repository_clean(tmp_path, opened):
    import asyncio
    import shutil

    from jupyter_server.serverapp import ServerApp

    repo = tmp_path / "repo"
    shutil.copytree(REPO / "notebooks", repo / "notebooks")
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "notebooks"], cwd=repo, check=True)
    app = ServerApp()  # configured from this venv's files, as `jupyter lab` is
    app.initialize(argv=[f"--ServerApp.root_dir={repo}", "--allow-root"],
                   new_httpserver=False, find_extensions=True)
    cm = app.contents_manager
    assert "Jupytext" in type(cm).__name__, type(cm).__mro__

    async def open_run_save():
        for py in NOTEBOOKS:
            path = f"notebooks/{py.stem}.{opened}"
            model = await cm.get(path, content=True, type="notebook")
            _as_a_kernel_leaves_it(model["content"])
            await cm.save({"type": "notebook", "content": model["content"]}, path)

    asyncio.run(open_run_save())
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    diff = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True).stdout
    assert status == "", f"saving in Jupyter dirtied the repository:\n{status}\n{diff[:3000]}"


def test_papermill_help_notebook_and_workbook_params():
    res = subprocess.run([str(BIN / "papermill"), "notebooks/01_reproduce.ipynb",
                          "--help-notebook"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "thinking_token_budget: int (default 1)" in res.stdout
    res = subprocess.run([sys.executable, "-m", "workbook.cli", "params",
                          "notebooks/02_trace.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: workbook run ENV --set NAME=VALUE")
    assert "Parameters of notebooks/02_trace.py:" in res.stdout
    assert "/tmp" not in res.stdout and "Usage:  [OPTIONS]" not in res.stdout
    missing = subprocess.run([sys.executable, "-m", "workbook.cli", "params",
                              "notebooks/nope.py"], cwd=REPO, capture_output=True, text=True)
    assert missing.returncode == 2 and "no such notebook" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_papermill_runs_the_paired_notebook_with_parameters(tmp_path):
    out = tmp_path / "out.ipynb"
    res = subprocess.run([str(BIN / "papermill"), "notebooks/01_reproduce.ipynb", str(out),
                          "-p", "thinking_token_budget", "3", "-p", "spec_method", "none",
                          "-p", "max_tokens", "8", "-p", "outdir", str(tmp_path / "run")],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "thinking_token_budget = 3" in injected[0].source
    streams = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    # vLLM's start-up log went to a file: one line in the cell instead of the whole log
    assert "engine started in" in streams and "vllm.log" in streams
    assert streams.count("INFO") < 3, streams[:2000]
    assert (tmp_path / "run" / "vllm.log").stat().st_size > 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())[
        "thinking_token_budget"] == 3


def _synthetic_trace(n_steps: int, k: int = 4, bad_step: int | None = None):
    """A trace of one request over ``n_steps`` steps (prefill + MTP k), as the tracer writes
    it: drafts accepted on even steps, the budget due (and missed) at ``bad_step``."""
    import pandas as pd

    rows, reqs, out = [], [], []
    for s in range(n_steps):
        n = 1 if s == 0 else k + 1
        accepted = s % 2 == 0
        emitted_here = []
        for lp in range(n):
            emit = lp == 0 or accepted
            tok = 7 if emit else None
            rows.append({"step": s, "req_id": "r", "slot": 0, "row": lp, "local_pos": lp,
                         "input_token": 7, "end_logit_raw": 0.1, "end_logit_before_apply": 0.1,
                         "end_logit_after_apply": 0.1, "end_logit_final": 0.1,
                         "forced": False, "forced_final": False, "sampled_vllm": tok,
                         "emitted_token": tok, "draft_accepted": accepted if lp else None,
                         "emitted": emit})
            if emit:
                emitted_here.append(7)
        reqs.append({"step": s, "req_id": "r", "path": "Sampler" if s == 0 else
                     "RejectionSampler", "gate": True, "fast_path": False, "budget_host": 3,
                     "budget_device": 3, "apply_called": True, "kernels_launched": True,
                     "use_thinking_budget": True, "enabled": True, "emitted": emitted_here})
        out += emitted_here
    expected = sum(len(r["emitted"]) for r in reqs[:bad_step]) if bad_step else None
    verdict = {"markers": {"end": [9]}, "requests": [
        {"req_id": "r", "budget": 3, "expected_end_index": expected,
         "honored": False if bad_step else None, "output": out}]}
    return {"rows": pd.DataFrame(rows), "requests": pd.DataFrame(reqs)}, verdict


@pytest.mark.parametrize("n_steps", [9, 500])
def test_explorer_stays_readable_for_short_and_long_traces(n_steps):
    import ipywidgets as w

    from workbook.report import grid

    frames, verdict = _synthetic_trace(n_steps, bad_step=n_steps * 2 // 3)
    box = grid.explorer(frames, verdict)

    def walk(x):
        yield x
        for c in getattr(x, "children", ()) or ():
            yield from walk(c)

    widgets = list(walk(box))
    cells = [x for x in widgets if isinstance(x, w.Button) and "wb-cell" in x._dom_classes]
    assert len(cells) == 5 * min(12, n_steps)  # a bounded window, whatever the trace length
    status = next(x for x in widgets if "wb-status" in getattr(x, "_dom_classes", ()))
    bad = n_steps * 2 // 3
    assert f"showing steps {max(0, min(bad - 3, n_steps - 12))}–" in status.value  # opens on it
    violated = [c for c in cells if (c.layout.border_top or "").startswith("3px solid #d62728")]
    assert len(violated) == 1
    nxt = next(x for x in widgets if "wb-next" in getattr(x, "_dom_classes", ()))
    before = status.value
    nxt.click()
    assert status.value != before or n_steps <= 12
    overview = next(x for x in widgets if isinstance(x, w.HTML) and "wb-overview" in x.value)
    blocks = overview.value.count("<span ")
    assert 0 < blocks <= 300 and "#d62728" in overview.value
    static = grid.explorer_static(frames, verdict)
    assert static.count("<td") <= 5 * 16 + 5 and "wbg-due-bad" in static
