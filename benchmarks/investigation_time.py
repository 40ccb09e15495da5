"""How long the default CPU investigation takes: ``workbook run cpu``, timed per phase.

    python benchmarks/investigation_time.py                # runs `workbook run cpu` first
    python benchmarks/investigation_time.py --run-dir outputs/cpu/<run-id>   # read one only
    python benchmarks/investigation_time.py --env cpu --only reported-mtp --out /tmp/bench

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="cpu")
    p.add_argument("--out", default="outputs")
    p.add_argument("--only", nargs="+")
    p.add_argument("--run-dir", help="read an existing run folder instead of running")
    args = p.parse_args(argv)
    if args.run_dir:
        report(args.run_dir, None)
        return 0
    run_dir, wall = run_batch(args.env, args.out, args.only)
    report(run_dir, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
