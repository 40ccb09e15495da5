"""The constraints grid as a study of the one pipeline (``workbook.run.constraints.grid``), without an engine:
its engines' configurations come from ``environments/constraints.yaml`` (defaults honored, the
entry's cells, ``--set``), bad input fails before any engine starts with one line naming it
(rc 2, no traceback), the differential's reference is the healthy configuration, and
``workbook report DIR`` renders a grid's run folder; ``--help`` lists every choice. The engine
path: tests/test_constraints.py (its engines are ``grid.config_for``'s) — and here one real
grid of one engine, a planted fault caught: exit 1, a line per engine in a log
(``--no-progress``), the steps with ``--progress``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workbook.core import rundir
from workbook.core.config import CONSTRAINT_FAULTS, ConfigError
from workbook.run.constraints import cases as C
from workbook.run.constraints import grid as G

REPO = Path(__file__).resolve().parents[1]


def workbook(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbook.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_choice():
    """Constraints, methods, batches, axes with their values, entries, constraint faults,
    modes, the exit codes: in ``--help``, not only in the error after a mistake."""
    text = " ".join(workbook("run", "--help").stdout.split())
    text = text.replace("- ", "-")  # argparse wraps at hyphens
    for name in (*C.METHODS, *C.CONSTRAINTS, *C.BATCHES, *G.entries(), "in-process", "server",
                 "constraints"):
        assert name in text, name
    for axis, values in yaml.safe_load((REPO / "environments" / "constraints.yaml")
                                       .read_text())["axes"].items():
        assert f"{axis}: {', '.join(map(str, values['values']))}" in text, axis
    assert "1 a cell was violated" in text and "0 every judged cell held" in text
    for args in (["python", "-m", "workbook.run.constraints.grid"],
                 ["python", "-m", "workbook.run.constraints.distribution"]):
        res = subprocess.run([sys.executable, *args[1:], "--help"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        flat = " ".join(res.stdout.split()).replace("- ", "-")
        assert res.returncode == 0 and "rejection-tempered-twice" in flat, args
        assert "1 a cell was violated" in flat
    dist = subprocess.run([sys.executable, "-m", "workbook.run.constraints.distribution",
                           "--help"], cwd=REPO, capture_output=True, text=True).stdout
    import re

    for opt in re.findall(r"^  (--[a-z-]+)", dist, flags=re.M):  # every option described
        assert re.search(rf"^  {opt}(?: [A-Z_]+)?\s*\n?\s+\S", dist, flags=re.M), opt
    check = " ".join(workbook("check-server", "--help").stdout.split()).replace("- ", "-")
    assert all(c in check for c in C.CONSTRAINTS) and "exit codes: 0" in check


def test_a_violated_grid_exits_1_with_a_line_per_engine(tmp_path):
    """One real engine (method none), a planted fault that breaks min_tokens there: exit 1;
    without progress (a log) one line for the engine; with ``--progress`` its steps too."""
    args = ("run", "constraints", "--methods", "none", "--constraints", "min_tokens",
            "--batches", "single", "--set", "constraint_fault=gate-off", "--out", tmp_path)
    res = workbook(*args, "--progress", timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "none: starting the engine" in res.stderr and "none: batch single" in res.stderr
    assert "none: ok, 1 violated in " in res.stderr and "Traceback" not in res.stderr
    assert "violated: min_tokens / none / single" in res.stdout
    assert G.exit_code("ok", [{"status": "holds"}, {"status": "refused"}]) == 0
    assert G.exit_code("ok", [{"status": "holds"}, {"status": "error"}]) == 3
    assert G.exit_code("failed", [{"status": "violated"}]) == 1
    assert G.exit_code("failed", []) == 3


def test_constraint_fault_names_are_the_hooks():
    from workbook.hooks.faults import constraints as constraint_faults

    assert set(CONSTRAINT_FAULTS) == {"none", *constraint_faults.FAULTS}


def test_engines_are_the_environments_defaults_entry_and_set():
    raw = yaml.safe_load((REPO / "environments" / "constraints.yaml").read_text())
    p = G.plan("constraints", {"num_spec_tokens": 2}, only="fault-bias-target-row-only",
               on_cpu=True)
    cfg = p.config("mtp")
    for k, v in raw["defaults"].items():
        if k != "num_spec_tokens":
            assert getattr(cfg, k) == v, k
    assert cfg.num_spec_tokens == 2 and cfg.spec_method == "mtp"
    assert (p.methods, p.constraints, p.batches, p.fault) == (
        ["none", "mtp"], ["allowed_token_ids"], ["single"], "bias-target-row-only")
    # no entry: every method (none first), constraint and batch; the command line narrows it
    full = G.plan("constraints", on_cpu=True)
    assert full.methods == list(C.METHODS) and full.constraints == list(C.CONSTRAINTS)
    assert full.batches == list(C.BATCHES) and full.fault is None
    assert G.plan("constraints", methods=["ngram"], batches=["mixed"],
                  on_cpu=True).methods == ["none", "ngram"]
    # the helper the engine tests start from is the same configuration
    assert G.config_for("eagle") == full.config("eagle").replace(num_spec_tokens=3)


@pytest.mark.parametrize("args,named", [
    (["--methods", "medusa"], "method 'medusa' is unknown; known: none, mtp"),
    (["--constraints", "top_q"], "constraint 'top_q' is unknown; known: thinking_token_budget"),
    (["--batches", "huge"], "batch 'huge' is unknown; known: single, mixed"),
    (["--only", "nope"], "--only 'nope': no such run"),
    (["--set", "num_spec_tokens=0"], "num_spec_tokens=0 must be in 1..16"),
    (["--set", "max_tokens=4096"], "max_tokens=4096 must be below max_model_len=1024"),
    (["--set", "constraint_fault=typo"], "constraint_fault='typo' is unknown; choose one of"),
    (["--set", "colour=red"], "--set: unknown parameter(s) ['colour']"),
    (["--set", "mode=server", "--axis", "async_scheduling"],
     "mode=server: axis 'async_scheduling': its non-default value keeps async"),
    (["--set", "watch=true"], "the grid keeps no trace and no start-up watch"),
    (["--set", "spec_method=mtp"], "--set spec_method: the grid chooses it per engine"),
])
def test_bad_input_fails_before_an_engine_in_one_line(tmp_path, args, named):
    res = workbook("run", "constraints", *args, "--out", tmp_path)
    assert res.returncode == 2, res.stderr
    assert named in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not res.stdout
    assert not any(tmp_path.iterdir())  # no run folder: nothing started


def test_grid_options_only_for_a_grid(tmp_path):
    env = tmp_path / "plain.yaml"
    env.write_text(yaml.safe_dump({"hardware": "hw", "runs": [{"name": "a"}]}))
    res = workbook("run", env, "--methods", "mtp", "--out", tmp_path)
    assert res.returncode == 2 and "--methods is for a constraints grid" in res.stderr


def test_reference_is_the_healthy_configuration():
    """With a constraint fault the differential compares against the healthy none, never
    against the faulted none cells (which are judged as cells)."""
    faulted_none = C.Cell("stop", "none", "single", "violated", output=[1, 9, 9])
    spec = C.Cell("stop", "mtp", "single", "violated", output=[1, 9, 9])
    healthy = C.Cell("stop", "none", "single", "holds", output=[1, 2])
    C.differential([faulted_none, spec], {}, reference=[healthy])
    assert spec.differential["identical"] is False and spec.differential["out_index"] == 1
    assert spec.differential["reference_token"] == 2 and faulted_none.differential is None
    C.differential([faulted_none, spec], {})  # without a reference: the grid's own none
    assert spec.differential["identical"] is True


def test_report_renders_a_grid_folder(tmp_path):
    grid = rundir.read_json(str(REPO / "outputs" / "cpu" / "constraints-0.32.0" / "grid.json"))
    run_id, folder = rundir.new_run_dir(str(tmp_path), "cpu")
    rundir.write_json(f"{folder}/{rundir.MANIFEST}", {"study": "constraints", "run_id": run_id,
                                                      "status": "ok", "runs": []})
    rundir.write_json(f"{folder}/grid.json", grid)
    rundir.write_sums(folder)
    out = tmp_path / "r.html"
    res = workbook("report", folder, "-o", out)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "Constraints under speculative decoding" in text and "stop_strings" in text


def test_plan_errors_are_config_errors():
    with pytest.raises(ConfigError, match="spec_method"):
        G.plan("constraints", {"spec_method": "mtp"}, on_cpu=True)
    with pytest.raises(ConfigError, match="one grid per run"):
        G.plan("constraints", only=["constraints-mtp", "constraints-eagle"], on_cpu=True)


def test_default_report_keeps_batches_and_grids_apart(tmp_path):
    """`workbook report` without folders: the newest notebook batch of each hardware as the
    batch, the newest grid run folder among the grids — a newer grid never hides the batch."""
    from workbook import cli

    made = []
    for study in (None, "constraints"):
        _, folder = rundir.new_run_dir(str(tmp_path), "cpu")
        rundir.write_json(f"{folder}/{rundir.MANIFEST}", {"status": "ok", "runs": [],
                                                          **({"study": study} if study else {})})
        rundir.write_sums(folder)
        made.append(folder)
    assert cli._batch_folders(str(tmp_path)) == ([made[0]], [])
    assert cli._latest_grids(str(tmp_path)) == [made[1]]


def test_validate_applies_the_grids_plan():
    res = workbook("validate", "constraints", "--only", "fault-stop-not-trimmed")
    assert res.returncode == 0, res.stderr
    assert "ok  fault-stop-not-trimmed  (constraints grid: none, mtp; 1 constraint(s); single; " \
           "constraint fault stop-not-trimmed)" in res.stdout
    res = workbook("validate", "constraints", "--set", "num_spec_tokens=99")
    assert res.returncode == 2 and "num_spec_tokens=99 must be in 1..16" in res.stderr


def test_hooks_install_the_row_check_and_the_constraint_fault_from_the_configuration():
    """What the grid asks of a batch's configuration, ``workbook.hooks.install`` installs (no
    engine: the hooks patch vLLM's classes) and the backend's ``stop`` removes."""
    from workbook import hooks
    from workbook.core.config import RunConfig
    from workbook.vllm import env as wb_env

    wb_env.prepare_process(RunConfig())  # before vLLM is imported (the Triton shim)
    cfg = RunConfig(row_check=True, constraint_fault="gate-off", trace=False)
    installed, tracer = hooks.install(cfg)
    try:
        assert tracer is None and hooks.row_check(installed) is not None
        assert [getattr(h, "name", None) for h in installed][0] == "constraint-fault:gate-off"
        assert all(getattr(h, "installed", True) for h in installed)
    finally:
        for h in reversed(installed):
            h.remove()
    assert hooks.row_check(hooks.install(RunConfig(trace=False))[0]) is None


def test_ctrl_c_stops_a_grid_in_one_line(tmp_path):
    """Ctrl-C while the engine starts: exit 130, one line on stderr naming the signal and the
    run folder, which is closed (manifest interrupted, SHA256SUMS) — no traceback."""
    import json
    import os
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "workbook.cli", "run", "constraints",
                             "--methods", "none", "--constraints", "min_tokens", "--batches",
                             "single", "--out", str(tmp_path)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/*/logs")) and time.time() < deadline:
        time.sleep(0.5)  # the engine's log folder: it is starting
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    (run_dir,) = tmp_path.glob("*/*/manifest.json")
    assert err.strip().splitlines() == [
        "workbook: interrupted by SIGINT; the run folder keeps what it had (manifest, "
        f"grid.json, SHA256SUMS): {run_dir.parent}"], err
    assert json.loads(run_dir.read_text())["status"] == "interrupted"
    assert (run_dir.parent / "SHA256SUMS").exists()


def test_ctrl_c_during_check_server_is_one_line(tmp_path):
    """check-server --constraints waiting on a server that does not answer: Ctrl-C is one
    line saying what was interrupted and that nothing was recorded, exit 130."""
    import http.server
    import os
    import signal
    import threading
    import time

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(30)

        do_POST = do_GET

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "workbook.cli", "check-server",
                                 f"http://127.0.0.1:{srv.server_port}", "--constraints"],
                                cwd=REPO, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(4)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        srv.shutdown()
    assert proc.returncode == 130 and not out
    assert err.strip().splitlines() == [
        "workbook check-server: interrupted (Ctrl-C); nothing was recorded (check-server "
        "writes --json only at its end); the server keeps running"], err
