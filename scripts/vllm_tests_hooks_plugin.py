"""pytest plugin (``-p vllm_tests_hooks_plugin``, with ``scripts/`` on ``PYTHONPATH``): the
workbook's hooks installed before any of vLLM's own tests runs, so they run through them.

In this process: ``workbook.hooks.install`` with the guard, the tracer and the row check (one
observer: ``GPUModelRunner.add_requests / sample_tokens / sample``,
``Sampler.apply_sampling_params``; the guard after ``GPUModelRunner.sample``). In every vLLM
process a test starts (an engine core, a worker): the ``vllm.general_plugins`` entry point
(``workbook.hooks.plugin``) from ``WORKBOOK_GUARD=1`` and ``WORKBOOK_TRACE_DIR``, set here before
any test (the row check's served twin needs a control file per batch and is left out there).
The hooks are removed at the end of the session (``pytest_unconfigure``).

Used by ``scripts/vllm_tests_with_hooks.py`` (both arms, counts side by side).
"""

from __future__ import annotations

import os
import tempfile

_STATE: dict = {}


def pytest_configure(config):
    trace_dir = os.environ.get("WORKBOOK_TRACE_DIR") or tempfile.mkdtemp(prefix="wb-vllm-tests-")
    os.environ["WORKBOOK_TRACE_DIR"] = trace_dir  # vLLM's own processes: the entry point
    os.environ["WORKBOOK_GUARD"] = "1"
    from workbook import hooks
    from workbook.core.config import RunConfig

    cfg = RunConfig(trace=True, guard=True, row_check=True)
    installed, tracer = hooks.install(cfg, trace_dir=os.path.join(trace_dir, "in-process"))
    _STATE.update(hooks=installed, tracer=tracer, dir=trace_dir)
    print(f"workbook hooks installed in pid {os.getpid()}: "
          f"{', '.join(type(h).__name__ for h in installed)}; trace dir {trace_dir}", flush=True)


def pytest_report_header(config):
    hs = _STATE.get("hooks") or []
    return [f"workbook hooks installed in this process: {len(hs)} patch set(s) "
            f"({', '.join(type(h).__name__ for h in hs)}); vLLM processes: WORKBOOK_GUARD=1, "
            f"WORKBOOK_TRACE_DIR={_STATE.get('dir')}"]


def pytest_unconfigure(config):
    hs = _STATE.pop("hooks", None) or []
    report = os.environ.get("WORKBOOK_HOOKS_REPORT")  # the runner's evidence that they ran
    if report:
        import json

        with open(report, "w") as f:
            json.dump({"patch_sets": [type(h).__name__ for h in hs],
                       "pid": os.getpid(), "trace_dir": _STATE.get("dir")}, f)
    for h in reversed(hs):
        h.remove()
