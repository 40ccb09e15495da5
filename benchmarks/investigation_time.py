"""How long the default CPU investigation takes: ``workbook run cpu``, timed per phase.

    python benchmarks/investigation_time.py                # runs `workbook run cpu` first
    python benchmarks/investigation_time.py --run-dir outputs/cpu/<run-id>   # read one only
    python benchmarks/investigation_time.py --env cpu --only reported-mtp --out /tmp/bench
    python benchmarks/investigation_time.py --fresh-clone /tmp/clone   # clone, setup.sh, run

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


def run_batch(env: str, out: str, only: list[str] | None) -> tuple[str, float]:
    cmd = [sys.executable, "-m", "workbook.cli", "run", env, "--out", out]
    if only:
        cmd += ["--only", *only]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    run_dir = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if not os.path.isfile(os.path.join(run_dir, "manifest.json")):
        sys.exit(f"workbook run failed (exit {res.returncode}); no run folder")
    return run_dir, wall


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
    args = p.parse_args(argv)
    if args.fresh_clone:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        subprocess.run(["git", "clone", "-q", repo, args.fresh_clone], check=True)
        t0 = time.perf_counter()
        subprocess.run(["bash", "setup.sh"], cwd=args.fresh_clone, check=True)
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = subprocess.run([os.path.join(args.fresh_clone, ".venv", "bin", "workbook"), "run",
                              args.env], cwd=args.fresh_clone, stdout=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        run_dir = os.path.join(args.fresh_clone, res.stdout.strip().splitlines()[-1])
        print(f"setup.sh: {setup:.1f} s   workbook run {args.env}: {wall:.1f} s   "
              f"fresh clone -> report: {setup + wall:.1f} s")
        report(run_dir, wall)
        return 0
    if args.run_dir:
        report(args.run_dir, None)
        return 0
    run_dir, wall = run_batch(args.env, args.out, args.only)
    report(run_dir, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
