"""The run-folder schema: what a run leaves on disk, and the JSON / manifest / checksum I/O.

A batch folder ``outputs/<hardware>/<run-id>/`` holds ``manifest.json`` (written first, with
``status: running``, rewritten after every run and closed last), ``environment.json``,
``report.html`` and ``SHA256SUMS`` (written last, over every file: a folder without it is
unfinished). Each run is a sub-folder with the evidence files ``EVIDENCE`` (JSON), the trace
tables ``trace/*.parquet`` (``workbook.core.tracefiles``) and, per executor, the executed
notebook, ``papermill.log``, ``server.log``, ``failure.json``.

Run ids are a timestamp plus a random suffix, created with ``mkdir`` (never an existing one):
nothing is ever overwritten. Committed evidence is kept lean (``scripts/lean_outputs.py``): a
bulky file ``x`` may be stored as ``x.gz`` (``read_json`` and ``verify`` read it as ``x``:
``SHA256SUMS`` keeps the digest of the original bytes), and rendered pages are left out
(``workbook report FOLDER`` renders them again). Deliberately not here: producing the evidence (``workbook.run``)
or running batches (``workbook.batch``).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import secrets
from typing import Any

from workbook.core import tracefiles

EVIDENCE = ("config", "effective", "outcome", "checks", "verdict", "probes", "watch",
            "timings")  # <name>.json in a run folder, in the order the pipeline writes them
MANIFEST = "manifest.json"
ENVIRONMENT = "environment.json"
SUMS = "SHA256SUMS"
REPORT = "report.html"
FAILURE = "failure.json"


# ---------------------------------------------------------------- JSON

def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def write_json(path: str, obj: Any) -> None:
    """Atomic JSON write (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=_jsonable)
    os.replace(tmp, path)


def read_json(path: str, default=None):
    """The JSON at ``path`` (or at ``path.gz``, as committed evidence keeps a bulky file);
    ``default`` when neither exists."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    if os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
            return json.load(f)
    return default


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


# ---------------------------------------------------------------- one run's evidence

def load_run(folder: str) -> dict[str, Any]:
    """Everything a run folder holds: the evidence JSON by name, ``frames`` (trace tables)."""
    data = {name: read_json(os.path.join(folder, f"{name}.json")) for name in EVIDENCE}
    tdir = os.path.join(folder, "trace")
    data["frames"] = tracefiles.load(tdir) if os.path.isdir(tdir) else {}
    return data


# ---------------------------------------------------------------- batch folders

def new_run_dir(out: str, hardware: str) -> tuple[str, str]:
    """A fresh ``<out>/<hardware>/<run-id>``; never an existing one."""
    base = os.path.join(out, hardware)
    os.makedirs(base, exist_ok=True)
    while True:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        run_id = f"{stamp}-{secrets.token_hex(3)}"
        path = os.path.join(base, run_id)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return run_id, path


def finished(run_dir: str) -> bool:
    """A batch folder whose manifest is closed and whose checksums were written."""
    m = read_json(os.path.join(run_dir, MANIFEST), {}) or {}
    return m.get("status") not in (None, "running") and \
        os.path.exists(os.path.join(run_dir, SUMS))


def latest_runs(out: str = "outputs") -> list[str]:
    """The newest finished batch folder of each hardware under ``out``."""
    found = []
    if not os.path.isdir(out):
        return found
    for hw in sorted(os.listdir(out)):
        base = os.path.join(out, hw)
        if not os.path.isdir(base):
            continue
        runs = sorted(d for d in os.listdir(base) if finished(os.path.join(base, d)))
        if runs:
            found.append(os.path.join(base, runs[-1]))
    return found


# ---------------------------------------------------------------- checksums

def file_sha256(path: str) -> str:
    """The file's digest; of a ``.gz`` kept for a listed file, the original bytes' (``verify``)."""
    h = hashlib.sha256()
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(run_dir: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(run_dir):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), run_dir)
            if rel != SUMS:
                found.append(rel.replace(os.sep, "/"))
    return sorted(found)


def write_sums(run_dir: str) -> str:
    """``SHA256SUMS`` in ``sha256sum`` format: every file of the run folder."""
    lines = [f"{file_sha256(os.path.join(run_dir, rel))}  {rel}\n" for rel in list_files(run_dir)]
    path = os.path.join(run_dir, SUMS)
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)
    return path


def verify(run_dir: str) -> list[str]:
    """Problems found (empty: every file matches and none is missing or unlisted)."""
    path = os.path.join(run_dir, SUMS)
    if not os.path.exists(path):
        return [f"{SUMS} missing in {run_dir}"]
    listed = {}
    with open(path) as f:
        for line in f:
            digest, _, rel = line.rstrip("\n").partition("  ")
            listed[rel] = digest
    problems = []
    for rel, digest in sorted(listed.items()):
        p = os.path.join(run_dir, rel)
        if not os.path.exists(p) and os.path.exists(p + ".gz") and not rel.endswith(".gz"):
            p += ".gz"  # kept compressed (lean evidence): the digest is of the original bytes
        if not os.path.exists(p):
            problems.append(f"missing: {rel}")
        elif file_sha256(p) != digest:
            problems.append(f"changed: {rel}")
    problems += [f"not listed: {rel}" for rel in list_files(run_dir)
                 if rel not in listed and rel.removesuffix(".gz") not in listed]
    return problems


def ignore_late_signals() -> None:
    """A signal has closed the run folder: SIGINT, SIGTERM and SIGHUP are ignored for the rest
    of the command, so that a late one (a second Ctrl-C, a signal reaching the process after
    Python's own handlers are gone at exit) cannot turn the documented exit status 128 + N into
    a death by signal. For the command line's exit path only (main thread)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
