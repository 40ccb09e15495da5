"""How long the default CPU investigation takes: ``workbook run cpu``, timed per phase.

    python benchmarks/investigation_time.py                # runs `workbook run cpu` first
    python benchmarks/investigation_time.py --run-dir outputs/cpu/<run-id>   # read one only
    python benchmarks/investigation_time.py --env cpu --only reported-mtp --out /tmp/bench
    python benchmarks/investigation_time.py --fresh-clone /tmp/clone   # clone, setup.sh, run

    python benchmarks/investigation_time.py --compare     # papermill vs papermill-warm, side by side
    python benchmarks/investigation_time.py --before DIR1 --after DIR2   # two existing folders
    python benchmarks/investigation_time.py --setup       # setup.sh into scratch venvs: uv vs pip

Every measured command also gets its CPU time (its process and every descendant, polled by pid
every 0.5 s, so processes killed or re-parented still count) and the machine's load (1-minute
load average before / after): the machine is shared, and wall time alone compares nothing.
A measured batch leaves ``<out>/bench-<run-id>.json`` (wall, CPU, load) beside its folder,
which ``--before / --after`` read back.

With ``--fresh-clone DIR``: ``git clone`` of this repository into DIR, ``bash setup.sh`` there
(timed: the README's first command's first half), then ``workbook run cpu`` with DIR's .venv.

Prints, per run, the phases ``workbook.run.pipeline`` recorded in ``timings.json`` (vLLM import,
engine start-up, generation incl. checks, the run's total) and papermill's wall time (kernel
start, notebook, teardown), then the sums and the batch's own wall time (validation,
environment capture, checksums). Reads ``manifest.json``; never judges the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time

COLS = ("import_s", "engine_start_s", "generate_s", "total_s")


def measured(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``cmd``; (its result, {wall_s, cpu_s, load_before, load_after}). CPU: user + system
    of the process and each descendant, read by pid every 0.5 s while it lives."""
    import psutil

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)
    cpu: dict[tuple[int, float], float] = {}
    tracked: dict[tuple[int, float], psutil.Process] = {}
    out: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    while True:
        try:
            root = psutil.Process(proc.pid)
            for p in [root] + root.children(recursive=True):
                try:
                    tracked.setdefault((p.pid, p.create_time()), p)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        for key, p in list(tracked.items()):
            try:
                t = p.cpu_times()
                cpu[key] = t.user + t.system
            except psutil.Error:
                tracked.pop(key)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    reader.join()
    wall = time.perf_counter() - t0
    res = subprocess.CompletedProcess(cmd, proc.returncode, "".join(out))
    return res, {"wall_s": round(wall, 1), "cpu_s": round(sum(cpu.values()), 1),
                 "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}


def run_batch(env: str, out: str, only: list[str] | None,
              executor: str | None = None) -> tuple[str, float]:
    cmd = [sys.executable, "-m", "workbook.cli", "run", env, "--out", out]
    if only:
        cmd += ["--only", *only]
    if executor:
        cmd += ["--executor", executor]
    res, m = measured(cmd)
    run_dir = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if not os.path.isfile(os.path.join(run_dir, "manifest.json")):
        sys.exit(f"workbook run failed (exit {res.returncode}); no run folder")
    m["executor"] = executor or "(the environment's)"
    with open(bench_file(run_dir), "w") as f:
        json.dump(m, f, indent=1)
    print(f"workbook run {env}: wall {m['wall_s']:.1f} s, CPU {m['cpu_s']:.1f} s (process + "
          f"children), load {m['load_before']} -> {m['load_after']} (1-min average, "
          f"{os.cpu_count()} cores)")
    return run_dir, m["wall_s"]


def bench_file(run_dir: str) -> str:
    run_dir = os.path.abspath(run_dir)
    return os.path.join(os.path.dirname(os.path.dirname(run_dir)),
                        f"bench-{os.path.basename(run_dir)}.json")


def phase_sums(run_dir: str) -> tuple[dict[str, float], int, dict]:
    """({phase: seconds summed over the runs}, runs, the bench file's numbers or {})."""
    from workbook.report.html import time_parts
    from workbook.report.runs import load_batch

    runs = load_batch(run_dir).runs
    sums: dict[str, float] = {}
    for r in runs:
        for lab, v in time_parts(r):
            sums[lab] = sums.get(lab, 0.0) + v
    try:
        with open(bench_file(run_dir)) as f:
            bench = json.load(f)
    except (OSError, ValueError):
        bench = {}
    return sums, len(runs), bench


def compare(before: str, after: str) -> None:
    """The two batches' phases side by side (seconds summed over the runs), then wall, CPU,
    load and each run's verdict."""
    (b, nb, bb), (a, na, ab) = phase_sums(before), phase_sums(after)
    print(f"\nbefore: {before}\nafter:  {after}")
    print(f"{'phase (s, summed over the runs)':<44}{'before':>9}{'after':>9}")
    for lab in dict.fromkeys([*b, *a]):
        print(f"  {lab:<42}{b.get(lab, 0.0):9.1f}{a.get(lab, 0.0):9.1f}")
    print(f"  {'runs: wall time, all phases':<42}{sum(b.values()):9.1f}{sum(a.values()):9.1f}")
    for key, what in (("wall_s", "batch wall (incl. report, checksums)"),
                      ("cpu_s", "CPU, process + children"), ("load_before", "load before"),
                      ("load_after", "load after")):
        print(f"  {what:<42}" + "".join(f"{d[key]:9.1f}" if key in d else f"{'-':>9}"
                                        for d in (bb, ab)))
    mb = json.load(open(os.path.join(before, "manifest.json")))
    ma = json.load(open(os.path.join(after, "manifest.json")))
    va, vb = ma.get("verdicts") or {}, mb.get("verdicts") or {}
    same = all(va.get(k) == v for k, v in vb.items()) and set(va) == set(vb)
    print(f"verdicts {'identical' if same else 'DIFFER'}: "
          + ", ".join(f"{k} {v}" + ("" if va.get(k) == v else f" -> {va.get(k)}")
                      for k, v in vb.items()))


def setup_times(repo: str) -> None:
    """``bash setup.sh`` into two scratch venvs: uv (the default) and pip (WORKBOOK_PIP=1)."""
    import shutil
    import tempfile

    for label, extra in (("uv", {}), ("pip", {"WORKBOOK_PIP": "1"})):
        venv = tempfile.mkdtemp(prefix=f"workbook-setup-{label}-")
        shutil.rmtree(venv)
        res, m = measured(["bash", "setup.sh"], cwd=repo,
                          env={**os.environ, **extra, "WORKBOOK_VENV": venv})
        print(f"setup.sh with {label}: {'ok' if res.returncode == 0 else 'FAILED'} "
              f"wall {m['wall_s']:.1f} s, CPU {m['cpu_s']:.1f} s, load {m['load_before']} -> "
              f"{m['load_after']} ({venv})", flush=True)
        shutil.rmtree(venv, ignore_errors=True)


def batch_wall(manifest: dict) -> float | None:
    try:
        t0 = dt.datetime.fromisoformat(manifest["started"])
        t1 = dt.datetime.fromisoformat(manifest["finished"])
    except (KeyError, TypeError, ValueError):
        return None
    return (t1 - t0).total_seconds()


def table(manifest: dict) -> list[list]:
    rows = []
    for r in manifest["runs"]:
        t = r.get("timings") or {}
        rows.append([r["name"], r["status"], *(t.get(c) for c in COLS), r.get("wall_s")])
    return rows


def fmt(v) -> str:
    return f"{v:9.1f}" if isinstance(v, (int, float)) else f"{'-':>9}"


def parts(run_dir: str) -> None:
    """Every second of each run's wall time, split as the report's time chart splits it
    (``workbook.report.html.time_parts``: pipeline parts, kernel start, notebook cells,
    papermill)."""
    from workbook.report.html import time_parts
    from workbook.report.runs import load_batch

    runs = load_batch(run_dir).runs
    split = {r.name: dict(time_parts(r)) for r in runs}
    labels = list(dict.fromkeys(k for d in split.values() for k in d))
    print("\nwhere each run's wall time goes (s):")
    for lab in labels:
        vals = [split[r.name].get(lab, 0.0) for r in runs]
        print(f"  {lab:<44}" + " ".join(f"{v:6.1f}" for v in vals) + f"  sum {sum(vals):6.1f}")
    print(f"  {'(runs)':<44}" + " ".join(f"{r.name[:6]:>6}" for r in runs))


def report(run_dir: str, measured_wall: float | None) -> None:
    with open(os.path.join(run_dir, "manifest.json")) as f:
        manifest = json.load(f)
    rows = table(manifest)
    head = ["run", "status", "import", "engine", "generate", "total", "papermill"]
    print(f"run folder: {run_dir}")
    print(f"{head[0]:<22}{head[1]:<9}" + "".join(f"{h:>10}" for h in head[2:]))
    for r in rows:
        print(f"{r[0]:<22}{r[1]:<9}" + "".join(" " + fmt(v) for v in r[2:]))
    sums = [sum(r[i] or 0.0 for r in rows) for i in range(2, 7)]
    print(f"{'sum':<31}" + "".join(" " + fmt(v) for v in sums))
    print(f"engine start-up: {sums[1]:.1f} s   generation: {sums[2]:.1f} s   "
          f"runs total: {sums[3]:.1f} s   papermill wall: {sums[4]:.1f} s")
    print(f"batch wall (manifest): {fmt(batch_wall(manifest)).strip()} s"
          + (f"   measured: {measured_wall:.1f} s" if measured_wall else ""))
    parts(run_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="cpu")
    p.add_argument("--out", default="outputs")
    p.add_argument("--only", nargs="+")
    p.add_argument("--run-dir", help="read an existing run folder instead of running")
    p.add_argument("--fresh-clone", metavar="DIR", help="clone into DIR, time setup.sh, run there")
    p.add_argument("--executor", choices=("papermill", "papermill-warm"),
                   help="the batch's executor (default: the environment's)")
    p.add_argument("--compare", action="store_true",
                   help="run the batch with papermill, then papermill-warm; side by side")
    p.add_argument("--before", metavar="DIR", help="with --after: compare two run folders")
    p.add_argument("--after", metavar="DIR")
    p.add_argument("--setup", action="store_true", help="time setup.sh with uv and with pip")
    args = p.parse_args(argv)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.setup:
        setup_times(repo)
        return 0
    if args.before and args.after:
        compare(args.before, args.after)
        return 0
    if args.compare:
        dirs = [run_batch(args.env, args.out, args.only, ex)[0]
                for ex in ("papermill", "papermill-warm")]
        compare(*dirs)
        return 0
    if args.fresh_clone:
        subprocess.run(["git", "clone", "-q", repo, args.fresh_clone], check=True)
        res, ms = measured(["bash", "setup.sh"], cwd=args.fresh_clone)
        if res.returncode:
            sys.exit(f"setup.sh failed (exit {res.returncode})")
        setup = ms["wall_s"]
        res, mr = measured([os.path.join(args.fresh_clone, ".venv", "bin", "workbook"), "run",
                            args.env], cwd=args.fresh_clone)
        wall = mr["wall_s"]
        run_dir = os.path.join(args.fresh_clone, res.stdout.strip().splitlines()[-1])
        print(f"setup.sh: {setup:.1f} s (CPU {ms['cpu_s']:.1f} s)   workbook run {args.env}: "
              f"{wall:.1f} s (CPU {mr['cpu_s']:.1f} s)   fresh clone -> report: "
              f"{setup + wall:.1f} s   load {ms['load_before']} -> {mr['load_after']}")
        report(run_dir, wall)
        return 0
    if args.run_dir:
        report(args.run_dir, None)
        return 0
    run_dir, wall = run_batch(args.env, args.out, args.only, args.executor)
    report(run_dir, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
