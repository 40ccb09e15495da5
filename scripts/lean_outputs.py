"""Keep the committed evidence under ``outputs/`` lean: the tree a clone and a GPU call carry.

    python scripts/lean_outputs.py            # lean every tracked file under outputs/
    python scripts/lean_outputs.py --check    # only report the size against the budget (exit 1 over)

What it does to each file git tracks under ``outputs/``:
- a rendered page (``*.html``) is removed: ``workbook report FOLDER`` renders it again from the
  evidence beside it (its line leaves the folder's ``SHA256SUMS``);
- an archive of row evidence (``*.tar.gz``, ``*.tgz``) is recompressed as ``*.tar.xz`` (about
  five times smaller on JSON rows; ``tar xf`` opens either);
- a bulky text file (JSON, JSON lines, logs, text; over ``--threshold`` bytes) is stored as
  ``FILE.gz`` (gzip, no name or time in the header, so the bytes are reproducible).
  ``workbook.core.rundir.read_json`` reads ``x.json.gz`` as ``x.json`` and ``workbook verify``
  checks it against the digest of the original bytes that ``SHA256SUMS`` already holds.
Summaries, verdict tables, READMEs and reproducers stay plain, and so does every file of the
run-folder schema that the workbook looks for by name (``KEEP_PLAIN``: the manifest, the
environment, each run's evidence JSON). Executed notebooks stay as they
are (the report reads their papermill metadata). The budget (``BUDGET_MB``) is checked by
``tests/test_outputs_budget.py``.
"""

from __future__ import annotations

import argparse
import gzip
import lzma
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_MB = 25.0
TEXT = (".json", ".jsonl", ".log", ".txt")
# the run-folder schema's files (workbook.core.rundir: MANIFEST, ENVIRONMENT, EVIDENCE), found by name
KEEP_PLAIN = {"manifest.json", "environment.json"} | {
    f"{n}.json" for n in ("config", "effective", "outcome", "checks", "verdict", "probes", "watch",
                          "timings")}


def tracked(root: str = ROOT) -> list[str]:
    """The files git tracks under ``outputs/`` (paths relative to the repository)."""
    out = subprocess.run(["git", "ls-files", "-z", "outputs"], cwd=root, check=True,
                         capture_output=True).stdout.decode()
    return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))]


def size_mb(paths: list[str], root: str = ROOT) -> float:
    return sum(os.path.getsize(os.path.join(root, p)) for p in paths) / 1e6


def gzip_file(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    with open(path + ".gz", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as g:
            g.write(data)
    os.remove(path)
    return path + ".gz"


def to_xz(path: str) -> str:
    """``x.tar.gz`` / ``x.tgz`` → ``x.tar.xz`` (the same tar bytes)."""
    stem = path[:-len(".tar.gz")] if path.endswith(".tar.gz") else path[:-len(".tgz")]
    with gzip.open(path, "rb") as f:
        data = f.read()
    with lzma.open(stem + ".tar.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(data)
    os.remove(path)
    return stem + ".tar.xz"


def _swap(root: str, old: str, new: str) -> None:
    subprocess.run(["git", "rm", "-q", "--cached", "--", old], cwd=root, check=True)
    subprocess.run(["git", "add", "-f", "--", os.path.relpath(new, root)], cwd=root, check=True)


def lean(threshold: int, root: str = ROOT) -> tuple[list[str], list[str]]:
    """(removed pages, compressed files); git's index follows."""
    removed, packed = [], []
    for rel in tracked(root):
        path = os.path.join(root, rel)
        if rel.endswith((".tar.gz", ".tgz")):
            _swap(root, rel, to_xz(path))
            packed.append(rel)
        elif rel.endswith(".html"):
            subprocess.run(["git", "rm", "-q", "--", rel], cwd=root, check=True)
            removed.append(rel)
        elif rel.endswith(TEXT) and os.path.getsize(path) > threshold \
                and os.path.basename(rel) not in KEEP_PLAIN:
            _swap(root, rel, gzip_file(path))
            packed.append(rel)
    drop_pages_from_sums(root)
    return removed, packed


def drop_pages_from_sums(root: str = ROOT) -> None:
    """Each ``SHA256SUMS`` under ``outputs/`` without the lines of rendered pages no longer there."""
    for rel in tracked(root):
        if os.path.basename(rel) != "SHA256SUMS":
            continue
        path, folder = os.path.join(root, rel), os.path.dirname(os.path.join(root, rel))
        lines = open(path, encoding="utf-8").readlines()
        keep = [ln for ln in lines if not (ln.rstrip("\n").endswith(".html") and not os.path.exists(
            os.path.join(folder, ln.rstrip("\n").partition("  ")[2])))]
        if keep != lines:
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report the size only")
    ap.add_argument("--threshold", type=int, default=32_000,
                    help="compress text files larger than this many bytes (default 32000)")
    a = ap.parse_args(argv)
    before = size_mb(tracked())
    if not a.check:
        removed, packed = lean(a.threshold)
        print(f"removed {len(removed)} rendered pages, compressed {len(packed)} files")
    after = size_mb(tracked())
    print(f"outputs/ tracked: {before:.1f} MB before, {after:.1f} MB now (budget {BUDGET_MB:.0f} MB)")
    return 0 if after <= BUDGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
