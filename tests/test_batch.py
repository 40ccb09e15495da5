"""``workbook run`` end to end: real papermill, real vLLM on the tiny CPU model, one process per run.

Each test writes its own small environment file and runs the ``workbook`` command in a
subprocess (as a user would), then checks what landed on disk:

- a bad parameter is rejected before any engine starts (no output folder, seconds not minutes);
- a successful run: folder layout, evidence files, manifest, ``SHA256SUMS`` (also checked with
  coreutils' ``sha256sum -c``); ``workbook verify`` passes, then fails after tampering;
- failing runs keep their partial executed notebook and get a failure row (a cell timeout, and
  an engine error raised inside the notebook);
- two consecutive batches never overwrite each other;
- signals: SIGINT (Ctrl-C) or SIGTERM sent to a real ``workbook run`` while its first run's
  engine starts stop that run's whole process tree (papermill, kernel, vLLM: no process left),
  record its failure row (status ``interrupted``, the stage it was in), close the manifest,
  write the report and ``SHA256SUMS`` and exit 130 / 143 printing the run folder; a second
  Ctrl-C forces an exit and leaves the folder unfinished, which ``workbook report`` skips;
- progress: the run's pipeline step (engine start, ...) is shown while it runs (``--progress``;
  by default only on a terminal: a redirected log gets one line per finished run); the end of
  ``workbook run`` prints the finding (the report's headline, one line per violated run) before
  the report's path;
- ``--set`` applies to and is validated against the runs ``--only`` selects; ``workbook
  validate`` applies the run's own rules (checks, platform): table-driven, no engine.

About 6–8 minutes on a 2-core machine (two engine starts, three interrupted ones).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_FILES = {"01_reproduce.ipynb", "01_reproduce.html", "parameters.yaml", "papermill.log",
             "config.json", "effective.json", "outcome.json", "verdict.json", "timings.json",
             "stage.json", "vllm.log"}


def workbook(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbook.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def env_file(tmp_path: Path, name: str, runs: list[dict], **top) -> Path:
    doc = {"hardware": "test-cpu", "notebook": "notebooks/01_reproduce.py", "timeout": 420,
           "defaults": {"model": "tiny-mimo-mtp", "max_tokens": 8}, "runs": runs, **top}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in (out / "test-cpu").iterdir()) if (out / "test-cpu").is_dir() else []


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def test_console_script_declared():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="console_scripts") if e.name == "workbook"]
    assert eps and eps[0].value == "workbook.cli:main"


@pytest.mark.parametrize("runs,needle", [
    ([{"name": "fine"}, {"name": "bad", "thinking_token_budget": -5}],
     ["run 'bad'", "thinking_token_budget=-5"]),
    ([{"name": "fine"}, {"name": "typo", "thinking_budget": 2}],
     ["run 'typo'", "thinking_budget"]),
    ([{"name": "fine", "model": "<SET: a checkpoint path>"}],
     ["run 'fine'", "model", "placeholder"]),
])
def test_bad_parameter_rejected_before_any_engine(tmp_path, runs, needle):
    out = tmp_path / "outputs"
    t0 = time.perf_counter()
    res = workbook("run", env_file(tmp_path, "bad", runs), "--out", out)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 2, res.stderr
    for n in needle:
        assert n in res.stderr
    assert not out.exists()  # nothing was created, so no run (and no engine) started
    assert elapsed < 45, elapsed  # an engine start alone takes longer than this on CPU


def _two_notebooks(tmp_path: Path) -> Path:
    """``a`` runs notebook 01 with checks A and B; ``b`` runs notebook 02, which declares no
    ``mode`` parameter (so ``--set mode=...`` cannot apply to it)."""
    return env_file(tmp_path, "two", [{"name": "a", "checks": ["A", "B"]},
                                      {"name": "b", "notebook": "notebooks/02_trace.py"},
                                      {"name": "c", "spec_method": "none"}])


@pytest.mark.parametrize("args,code,needles", [
    # --set is validated against the selected runs only
    (["--only", "c", "--set", "mode=server"], 0, ["ok  c"]),
    (["--only", "a", "c", "--set", "max_tokens=5"], 0, ["ok  a", "ok  c"]),
    (["--set", "mode=server"], 2, ["run 'a'", "check B"]),  # a is first, and has check B
    (["--only", "b", "--set", "mode=server"], 2, ["run 'b'", "mode"]),  # 02 has no mode
    # validate applies the run's own rules: check B in a server run fails here, not 5 s in
    (["--only", "a", "--set", "mode=server"], 2, ["run 'a'", "check B", "mode='in-process'"]),
    # ... and the platform's (this machine is a CPU host)
    (["--only", "c", "--set", "async_scheduling=true"], 2, ["async_scheduling", "CPU"]),
    (["--only", "c", "--set", "async_scheduling=true", "--platform", "gpu"], 0, ["ok  c"]),
    (["--only", "nope"], 2, ["--only ['nope']", "runs: ['a', 'b', 'c']"]),
])
def test_validate_selected_runs_with_the_runs_rules(tmp_path, args, code, needles):
    res = workbook("validate", _two_notebooks(tmp_path), *args, timeout=120)
    assert res.returncode == code, (res.stdout, res.stderr)
    for n in needles:
        assert n in (res.stdout + res.stderr), (res.stdout, res.stderr)
    if code == 0:
        assert "ok  b" not in res.stdout  # the run --only left out is not listed


def test_set_applies_to_the_selected_runs_only(tmp_path):
    from workbook import batch
    from workbook.core import config
    from workbook.run import pipeline

    env = batch.load_environment(str(_two_notebooks(tmp_path)), {"max_tokens": 5},
                                 only=["c"], on_cpu=True)
    assert [r.name for r in env.runs] == ["c"]
    assert env.runs[0].params["max_tokens"] == 5
    full = batch.load_environment(str(_two_notebooks(tmp_path)), {}, on_cpu=True)
    assert [r.name for r in full.runs] == ["a", "b", "c"]
    assert all(r.params["max_tokens"] == 8 for r in full.runs)
    assert pipeline.check_checks is config.check_checks  # one rule for validate and the run


@pytest.mark.parametrize("stdout_tty,stderr_tty,expected", [
    (True, True, True), (False, True, False), (True, False, False), (False, False, False)])
def test_progress_bar_only_on_a_terminal(monkeypatch, stdout_tty, stderr_tty, expected):
    from workbook import cli
    from workbook.core import progress

    monkeypatch.setattr(sys.stdout, "isatty", lambda: stdout_tty, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: stderr_tty, raising=False)
    assert progress.enabled(None) is expected
    args = cli.build_parser().parse_args(["run", "cpu"])
    assert args.progress is None  # auto: progress.enabled decides
    assert cli.build_parser().parse_args(["run", "cpu", "--no-progress"]).progress is False
    assert cli.build_parser().parse_args(["run", "cpu", "--progress"]).progress is True


def test_without_progress_a_log_gets_one_line_per_run(capsys):
    from workbook.core.progress import Progress

    bar = Progress(2, "cpu", enabled=False)
    bar.set_postfix_str("first")
    bar.stage("start", "first: engine start (3 s)")
    bar.stage("request", "first: request (9 s)")
    bar.done("first: ok in 40 s, verdict honored")
    bar.close()
    err = capsys.readouterr().err
    assert err == "first: ok in 40 s, verdict honored\n"


def test_progress_off_a_terminal_is_a_line_per_step(capsys):
    """``--progress`` in a log (workbook.core.progress, every long command's): one line per new
    step, one per finished unit; the distribution oracle counts its cells up front."""
    from workbook.core.progress import Progress
    from workbook.run.constraints import distribution

    with Progress(2, "grid", enabled=True, unit="engine") as bar:
        bar.step("mtp: starting the engine")
        bar.step("mtp: starting the engine")  # the same step: no second line
        bar.step("mtp: batch single")
        bar.done("mtp: ok, 13 holds in 60.0 s")
    lines = [ln.strip() for ln in capsys.readouterr().err.replace("\r", "\n").splitlines()
             if ln.strip() and not ln.strip().startswith("grid:")]
    assert lines == ["mtp: starting the engine", "mtp: batch single",
                     "mtp: ok, 13 holds in 60.0 s"], lines
    p = distribution.plan("none,mtp", "unconstrained,bad_words", "draft-rows-untempered",
                          "unconstrained", repeats=2)
    assert distribution.n_cells(p) == 2 * (2 + 2 + 1)


def test_reporter_templates_need_a_model_path(tmp_path):
    res = workbook("validate", "thor")
    assert res.returncode == 2
    assert "placeholder" in res.stderr and "--set model=" in res.stderr
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    res = workbook("validate", "thor", "--set", f"model={ckpt}")
    assert res.returncode == 0, res.stderr
    assert "reported-mtp" in res.stdout


def test_run_writes_layout_manifest_sums_and_verify_detects_tampering(tmp_path):
    out = tmp_path / "outputs"
    env = env_file(tmp_path, "one", [{"name": "mtp", "spec_method": "mtp", "checks": ["A"]}])
    res = workbook("run", env, "--out", out, "--progress")
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = run_dirs(out)
    assert res.stdout.strip().endswith(run_dir.name)
    assert f"report: {run_dir / 'report.html'}" in res.stdout
    out_lines = res.stdout.strip().splitlines()  # the finding, then the report, then the folder
    assert out_lines[-2] == f"report: {run_dir / 'report.html'}"
    assert "thinking_token_budget" in out_lines[0] and "run" in out_lines[0]
    assert {"environment.json", "manifest.json", "report.html", "SHA256SUMS"} <= set(
        os.listdir(run_dir))
    folder = run_dir / "mtp"
    names = {p.name for p in folder.iterdir()}
    assert RUN_FILES <= names, names
    assert {"steps.parquet", "requests.parquet", "rows.parquet"} <= set(
        os.listdir(folder / "trace"))
    m = manifest(run_dir)
    assert m["status"] == "ok" and m["hardware"] == "test-cpu" and m["run_id"] == run_dir.name
    (row,) = m["runs"]
    assert row["status"] == "ok" and row["failure"] is None
    assert row["verdict"]["verdict"] in ("honored", "violated", "inconclusive")
    assert row["outcome"]["finish_reason"] in ("length", "stop")
    assert row["timings"]["engine_start_s"] > 0 and row["wall_s"] > row["timings"]["total_s"]
    assert m["verdicts"] == {"mtp": row["verdict"]["verdict"]}
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["software"]["torch"] and environment["python"]
    assert environment["workbook_git"]["commit"]
    assert "vLLM" in (environment["collect_env"]["output"] or "")
    nb = nbformat.read(folder / "01_reproduce.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and str(folder) in injected[0].source
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    checks = json.loads((folder / "checks.json").read_text())
    assert set(checks) == {"A"}
    assert json.loads((folder / "stage.json").read_text())["stage"] == "finish"
    assert row["notebook_html"] == "01_reproduce.html"
    report = (run_dir / "report.html").read_text()
    assert 'href="mtp/01_reproduce.html"' in report  # the report links the executed notebook
    assert "mtp: engine start" in res.stderr  # the progress named the step the run was in

    listed = [line.split("  ", 1)[1] for line in (run_dir / "SHA256SUMS").read_text().splitlines()]
    on_disk = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                     if p.is_file() and p.name != "SHA256SUMS")
    assert listed == on_disk
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=run_dir, check=True)
    ok = workbook("verify", run_dir)
    assert ok.returncode == 0, ok.stderr

    with open(folder / "outcome.json", "a") as f:
        f.write(" ")
    bad = workbook("verify", run_dir)
    assert bad.returncode == 1 and "changed: mtp/outcome.json" in bad.stderr
    (folder / "outcome.json").write_bytes((folder / "outcome.json").read_bytes()[:-1])
    assert workbook("verify", run_dir).returncode == 0
    (folder / "extra.txt").write_text("x")
    bad = workbook("verify", run_dir)
    assert bad.returncode == 1 and "not listed: mtp/extra.txt" in bad.stderr


def test_failing_runs_keep_partial_notebook_and_failure_row(tmp_path):
    broken = tmp_path / "broken-ckpt"  # passes validation (a folder with config.json) ...
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"],
                                                    "model_type": "no_such_model"}))
    out = tmp_path / "outputs"
    env = env_file(tmp_path, "failing", [
        {"name": "slow", "notebook": "tests/notebooks/blocks.py", "timeout": 15},  # blocks
        {"name": "broken", "spec_method": "none", "model": str(broken)},  # ... engine error
    ])
    res = workbook("run", env, "--out", out)
    assert res.returncode == 1, res.stderr[-3000:]
    (run_dir,) = run_dirs(out)
    m = manifest(run_dir)
    assert m["status"] == "failed" and m["counts"] == {"ok": 0, "failed": 1, "timeout": 1,
                                                       "interrupted": 0}
    slow, broken_row = m["runs"]

    assert slow["status"] == "timeout"
    assert slow["failure"]["ename"] == "CellTimeoutError"
    assert "time.sleep" in slow["failure"]["cell_source_head"]
    nb = nbformat.read(run_dir / "slow" / "blocks.ipynb", as_version=4)
    assert "time.sleep" in nb.cells[slow["failure"]["cell_index"]].source
    assert (run_dir / "slow" / "config.json").exists()  # evidence written before the failure

    assert broken_row["status"] == "failed"
    f = broken_row["failure"]
    assert f["ename"] and f["evalue"] and f["traceback_tail"]
    assert f["runner_exception"] == "PapermillExecutionError"
    nb = nbformat.read(run_dir / "broken" / "01_reproduce.ipynb", as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors and errors[0].ename == f["ename"]
    assert nb.cells[f["cell_index"]].source.startswith("res = pipeline.run")
    assert workbook("verify", run_dir).returncode == 0


def test_consecutive_batches_never_overwrite(tmp_path):
    out = tmp_path / "outputs"
    env = env_file(tmp_path, "twice", [{"name": "quick", "notebook": "tests/notebooks/blocks.py",
                                        "timeout": 2}])
    first = workbook("run", env, "--out", out)
    (d1,) = run_dirs(out)
    sums1 = (d1 / "SHA256SUMS").read_text()
    second = workbook("run", env, "--out", out)
    assert first.returncode == second.returncode == 1  # both time out, on purpose (blocks)
    d1b, d2 = run_dirs(out)
    assert d1b == d1 and d2 != d1
    assert (d1 / "SHA256SUMS").read_text() == sums1
    assert workbook("verify", d1).returncode == 0 and workbook("verify", d2).returncode == 0
    assert manifest(d2)["run_id"] != manifest(d1)["run_id"]


def test_new_run_dir_is_always_fresh(tmp_path):
    from workbook.core.rundir import new_run_dir

    made = {new_run_dir(str(tmp_path), "hw")[0] for _ in range(200)}
    assert len(made) == 200 and len(os.listdir(tmp_path / "hw")) == 200


def test_notebook_declares_every_runconfig_field_and_has_a_kernelspec():
    import jupytext

    from workbook import batch
    from workbook.core.config import RunConfig

    path = REPO / "notebooks" / "01_reproduce.py"
    _, declared = batch.read_notebook(str(path))
    fields = set(RunConfig.field_names())
    assert fields | {"outdir", "checks"} <= set(declared)
    assert all(declared[k]["help"] for k in declared)  # `name: type = default  # help`
    nb = jupytext.read(path)
    assert nb.metadata["kernelspec"]["name"]
    assert not any(c.get("outputs") for c in nb.cells)
    assert "parameters" in nb.cells[1].metadata.get("tags", [])
    res = workbook("params", path)
    assert res.returncode == 0 and "thinking_token_budget: int (default 1)" in res.stdout


# ---------------------------------------------------------------- signals


def start_run(tmp_path: Path, name: str, **top) -> tuple[subprocess.Popen, Path]:
    """``workbook run`` on two runs, in its own process group (as a terminal would run it);
    ``top``: the environment's top-level keys (``executor``)."""
    out = tmp_path / "outputs"
    env = env_file(tmp_path, name, [{"name": "first", "spec_method": "mtp"},
                                    {"name": "second", "spec_method": "none"}], **top)
    proc = subprocess.Popen([sys.executable, "-m", "workbook.cli", "run", str(env), "--out",
                             str(out), "--progress"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, out


def wait_for_stage(out: Path, run: str, stage: str, proc, timeout: float = 240) -> Path:
    """The batch folder once ``run``'s stage.json names ``stage`` (the engine is starting)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        for d in run_dirs(out):
            st = d / run / "stage.json"
            if st.exists() and json.loads(st.read_text() or "{}").get("stage") == stage:
                return d
        time.sleep(0.5)
    raise TimeoutError(f"{run} never reached stage {stage}")


def processes_of(run_dir: Path) -> list:
    """Live processes that belong to this batch: tagged with its folder (papermill, kernel,
    vLLM) or naming it on their command line."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            tag = p.environ().get("WORKBOOK_RUN_TAG", "")
            cmd = " ".join(p.cmdline())
        except (psutil.Error, OSError):
            continue
        if tag.startswith(str(run_dir)) or str(run_dir) in cmd:
            found.append(f"{p.pid} {cmd[:120]}")
    return found


@pytest.mark.parametrize("sig,code,executor", [
    (signal.SIGINT, 130, "papermill"), (signal.SIGTERM, 143, "papermill"),
    # `workbook run cpu`'s executor: its papermill thread outlives the killed kernel; a
    # Thread.join cut by the signal once let the run close the log under it (a traceback)
    (signal.SIGINT, 130, "papermill-warm")])
def test_signal_stops_the_run_and_leaves_a_complete_record(tmp_path, sig, code, executor):
    proc, out = start_run(tmp_path, f"sig{int(sig)}", executor=executor)
    run_dir = wait_for_stage(out, "first", "start", proc)
    time.sleep(3)  # vLLM is importing / starting its engine in the kernel now
    assert processes_of(run_dir), "the run's processes should be alive before the signal"
    t0 = time.perf_counter()
    os.killpg(proc.pid, sig)  # Ctrl-C reaches the terminal's process group; SIGTERM the same
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == code, (stdout, stderr[-3000:])
    assert time.perf_counter() - t0 < 120
    assert "Traceback" not in stderr and "Error" not in stderr, stderr[-3000:]
    assert stdout.strip().splitlines()[-1] == str(run_dir)
    assert f"interrupted by {sig.name}" in stderr
    # its last line: what was interrupted and where the complete record is
    assert stderr.strip().splitlines()[-1] == (
        f"workbook: interrupted by {sig.name} during run first; the run folder is complete "
        f"(manifest, SHA256SUMS): {run_dir}")
    assert "first: engine start" in stderr  # the progress showed the step it was in
    time.sleep(1)
    assert processes_of(run_dir) == []

    m = manifest(run_dir)
    assert m["status"] == "interrupted" and m["finished"]
    assert m["interrupted"]["signal"] == sig.name and m["interrupted"]["run"] == "first"
    assert m["not_started"] == ["second"] and m["counts"]["interrupted"] == 1
    (row,) = m["runs"]
    assert row["name"] == "first" and row["status"] == "interrupted"
    assert row["failure"]["ename"] == "Interrupted" and row["failure"]["stage"] == "start"
    assert sig.name in row["failure"]["evalue"]
    assert (run_dir / "first" / "01_reproduce.ipynb").exists()  # the partial notebook
    assert (run_dir / "SHA256SUMS").exists() and workbook("verify", run_dir).returncode == 0
    report = (run_dir / "report.html").read_text()
    assert "interrupted by " + sig.name in report and "Every run finished" not in report
    said = "0 of 2 planned runs finished; not started: second."
    assert said in report and said in stdout  # what finished, in the report and the terminal
    assert "every run" not in stdout.splitlines()[0]

    from workbook.core import rundir

    assert rundir.latest_runs(str(out)) == [str(run_dir)]  # finished: closed and summed


def test_second_ctrl_c_forces_and_the_folder_stays_unfinished(tmp_path):
    proc, out = start_run(tmp_path, "force")
    run_dir = wait_for_stage(out, "first", "start", proc)
    time.sleep(2)
    import threading

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")),
                              daemon=True)
    reader.start()
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.time() + 60  # the first Ctrl-C is being handled (two at once are one)
    while not any("SIGINT received" in ln for ln in lines) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)  # (communicate reads what is left)
    reader.join(timeout=10)
    stderr = "".join(lines) + (rest or "")
    assert proc.returncode == 130, stderr[-3000:]
    assert "forced exit" in stderr and str(run_dir) in stderr
    time.sleep(1)
    assert processes_of(run_dir) == []
    assert not (run_dir / "SHA256SUMS").exists()

    from workbook.core import rundir

    assert rundir.latest_runs(str(out)) == []
    res = workbook("report", "--out", out)
    assert res.returncode == 2
    assert f"skipped unfinished batch folder (no closed manifest or no SHA256SUMS): {run_dir}" \
        in res.stderr


def test_warm_kernel_shares_the_engine_and_keeps_each_runs_record(tmp_path):
    """executor papermill-warm (workbook.batch.warmkernel): the second run reuses the first's
    kernel and engine, yet has its own folder, notebook and evidence; a run that times out keeps
    its failure row and partial notebook; no process of the batch outlives it."""
    import psutil

    out = tmp_path / "outputs"
    env = env_file(tmp_path, "warm", [
        {"name": "a", "spec_method": "mtp", "checks": ["A"]},
        {"name": "b", "spec_method": "mtp", "checks": ["A"]},
        {"name": "slow", "notebook": "tests/notebooks/blocks.py", "timeout": 20},
    ], executor="papermill-warm")
    res = workbook("run", env, "--out", out)
    assert res.returncode == 1, res.stderr[-3000:]  # slow times out, on purpose
    (run_dir,) = run_dirs(out)
    a, b, slow = manifest(run_dir)["runs"]
    for row in (a, b):
        assert row["status"] == "ok" and row["failure"] is None, row["failure"]
        names = set(os.listdir(run_dir / row["name"]))
        assert (RUN_FILES | {"kernel.log"}) <= names, names
        nb = nbformat.read(run_dir / row["name"] / "01_reproduce.ipynb", as_version=4)
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert str(run_dir / row["name"]) in injected[0].source
    assert a["timings"]["engine_start_s"] > 0
    assert b["timings"]["start_s"] < a["timings"]["start_s"]  # b did not start an engine
    assert b["verdict"]["verdict"] == a["verdict"]["verdict"]
    assert b["outcome"] == a["outcome"]  # the shared engine answers as the first run's did
    assert "reused" in (run_dir / "b" / "vllm.log").read_text()[:200]
    assert slow["status"] == "timeout" and slow["failure"]["ename"] == "CellTimeoutError"
    nb = nbformat.read(run_dir / "slow" / "blocks.ipynb", as_version=4)
    assert "time.sleep" in nb.cells[slow["failure"]["cell_index"]].source
    left = []
    for p in psutil.process_iter():
        try:
            if (p.environ().get("WORKBOOK_RUN_TAG") or "").startswith(str(run_dir)):
                left.append(p.pid)
        except (psutil.Error, OSError):
            pass
    assert not left, f"processes of the batch still alive: {left}"
    assert workbook("verify", run_dir).returncode == 0


def test_unknown_executor_is_a_one_line_error(tmp_path):
    env = env_file(tmp_path, "badexec", [{"name": "a"}], executor="warm-ish")
    res = workbook("validate", env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "executor='warm-ish'" in res.stderr and "papermill-warm" in res.stderr
