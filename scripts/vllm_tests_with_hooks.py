"""vLLM's own tests with and without the workbook's hooks: every test that passes without them
must pass with them (the tracer, the row check and the guard never change what vLLM computes).

    python scripts/vllm_tests_with_hooks.py TESTS_ROOT [PATH ...] --out DIR [--timeout S]
        [--pythonpath P] [--env KEY=VALUE ...] [--deselect NODEID ...] [--pytest-arg A ...]

``TESTS_ROOT``: a folder holding vLLM's ``tests/`` (extracted from the sdist of the installed
vLLM's version, and nothing else: a ``vllm/`` beside it would shadow the installed package);
``PATH``: test files or folders under it (default ``tests/v1/sample``). Runs pytest twice in
``TESTS_ROOT`` with the Python running this script — once plain, once with ``-p
vllm_tests_hooks_plugin`` (``scripts/vllm_tests_hooks_plugin.py``: the hooks installed in
every process before any test) — each arm's outcome per test from its JUnit XML, and prints the
counts side by side (collected, passed, failed, errors, skipped, wall time). Writes
``DIR/{without,with}.xml``, ``DIR/{without,with}.log`` and ``DIR/summary.json``. Exit 1 when a
test passed without the hooks and not with them; 2 for bad input (one line, before any run).
Progress: pytest's own progress line per arm; Ctrl-C stops the arm's pytest and prints one line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "vllm_tests_hooks_plugin"
ARMS = ("without", "with")


def fail(msg: str) -> None:
    print(f"vllm_tests_with_hooks: {msg}", file=sys.stderr)
    sys.exit(2)


def args_of(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("paths", nargs="*", default=["tests/v1/sample"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per arm")
    ap.add_argument("--pythonpath", default="", help="extra PYTHONPATH entries (os.pathsep)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for both arms")
    ap.add_argument("--deselect", action="append", default=[], help="a node id, both arms")
    ap.add_argument("--pytest-arg", action="append", default=[],
                    help="one more pytest argument for both arms (e.g. --noconftest)")
    a = ap.parse_args(argv)
    root = Path(a.root)
    if not (root / "tests").is_dir():
        fail(f"{root} holds no tests/ folder (extract vLLM's sdist's tests/ there)")
    if (root / "vllm").exists():
        fail(f"{root / 'vllm'} exists: it would shadow the installed vllm; extract tests/ only")
    for p in a.paths:
        if not (root / p).exists():
            fail(f"{p} is not under {root}")
    for kv in a.env:
        if "=" not in kv:
            fail(f"--env {kv!r} is not KEY=VALUE")
    if a.timeout <= 0:
        fail(f"--timeout must be positive, got {a.timeout}")
    return a


def outcomes(xml: Path) -> dict[str, str]:
    """Per test (``file::name``): passed / failed / error / skipped, from pytest's JUnit XML."""
    if not xml.exists():
        return {}
    out = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        name = f"{tc.get('classname')}::{tc.get('name')}"
        kinds = {c.tag for c in tc}
        out[name] = "failed" if "failure" in kinds else "error" if "error" in kinds else \
            "skipped" if "skipped" in kinds else "passed"
    return out


def run_arm(arm: str, a, out: Path) -> dict:
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in a.env)
    paths = [str(REPO), str(REPO / "scripts")] + [p for p in a.pythonpath.split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", f"--junitxml={out / (arm + '.xml')}", "-rN"]
    if arm == "with":
        cmd += ["-p", PLUGIN]
        env["WORKBOOK_HOOKS_REPORT"] = str(out / "hooks.json")
    for d in a.deselect:
        cmd += ["--deselect", d]
    cmd += a.pytest_arg
    cmd += a.paths
    print(f"[{arm} hooks] {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    with open(out / f"{arm}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=a.root, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(("tests/", "[", ".", "s", "F", "E")) and "%]" in line:
                    print(f"  [{arm}] {line.rstrip()[-60:]}", flush=True)  # pytest's progress
            proc.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            log.write(f"\n[timed out after {a.timeout} s]\n")
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            print(f"interrupted: the {arm}-hooks arm stopped; partial results in {out}")
            sys.exit(130)
    wall = time.monotonic() - t0
    res = outcomes(out / f"{arm}.xml")
    counts = {k: sum(1 for v in res.values() if v == k)
              for k in ("passed", "failed", "error", "skipped")}
    return {"collected": len(res), **counts, "wall_s": round(wall, 1), "rc": proc.returncode,
            "tests": res}


def main(argv=None) -> int:
    a = args_of(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = {arm: run_arm(arm, a, out) for arm in ARMS}
    wo, wi = arms["without"]["tests"], arms["with"]["tests"]
    broken = sorted(t for t, v in wo.items() if v == "passed" and wi.get(t) != "passed")
    fixed = sorted(t for t, v in wi.items() if v == "passed" and wo.get(t) != "passed")
    import vllm

    hooks_json = out / "hooks.json"
    summary = {"vllm": vllm.__version__, "root": str(a.root), "paths": a.paths,
               "pytest_args": a.pytest_arg,
               "hooks": json.loads(hooks_json.read_text()) if hooks_json.exists() else None,
               "env": a.env, "deselect": a.deselect,
               **{arm: {k: v for k, v in r.items() if k != "tests"} for arm, r in arms.items()},
               "passed_without_not_with": broken, "passed_with_not_without": fixed,
               "outcomes": {t: [wo.get(t), wi.get(t)] for t in sorted(set(wo) | set(wi))}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nvLLM {vllm.__version__} tests {' '.join(a.paths)} in {a.root}")
    print(f"{'':12}{'collected':>10}{'passed':>8}{'failed':>8}{'errors':>8}{'skipped':>9}"
          f"{'wall s':>9}")
    for arm in ARMS:
        r = arms[arm]
        print(f"{arm + ' hooks':12}{r['collected']:>10}{r['passed']:>8}{r['failed']:>8}"
              f"{r['error']:>8}{r['skipped']:>9}{r['wall_s']:>9}")
    print(f"passed without the hooks, not with them: {len(broken)}"
          + "".join(f"\n  {t}" for t in broken))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
