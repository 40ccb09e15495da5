"""The row check inside a served engine (``vllm serve``): the grid's hooks, driven by files.

The plugin (``workbook.hooks.plugin``) calls ``install_from_dir(d)`` in a model-runner process
when ``WORKBOOK_ROW_CHECK_DIR=d`` is set. It installs the same collector an in-process grid cell
gets from ``workbook.hooks.install`` (``rowcheck.RowCheck`` in one ``observer.Observer``) and:

- before every ``GPUModelRunner.add_requests`` (each real step, before its requests register),
  reads ``d/control.json`` (``{"seq": n, "constraint_fault": name}``) when it changed and
  installs that constraint fault (``constraint_faults.inject``), removing the previous one: the
  grid sends a faulted batch and then its healthy reference on the same server;
- after every ``GPUModelRunner.sample_tokens`` (the step is over), materializes the row check's
  pending step (one host copy per step, as the served tracer's flush) and appends what is new —
  registrations (with each request's ``contracts.Params``, prompt, markers), step records,
  prompt rows, errors — as JSON lines to ``d/<pid>/rows.jsonl``. Lines are appended before the
  step's output leaves the worker, so a request's records are on disk when its response arrives.

Deliberately not here: judging (``workbook.run.rowjudge`` over ``workbook.run.gridserve``'s
reader), the lm_head edits of the zeroed / scaled batches (refused over a server), anything in
the front-end or engine-core processes (the plugin does not touch them).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

CONTROL = "control.json"
ROWS = "rows.jsonl"


class ServedRows:
    """The row check + the control file + the per-step flush, in one worker process."""

    def __init__(self, folder: str):
        from workbook.hooks.observer import Observer
        from workbook.hooks.rowcheck import RowCheck

        self.folder = folder
        self.rc = RowCheck()
        self.observer = Observer([self.rc])
        self.fault = None  # (name, PatchSet)
        self.control_stat = None
        self.written = {"steps": 0, "registrations": 0, "errors": 0}
        self.prompt_rows_sent: set = set()
        self.out = os.path.join(folder, str(os.getpid()))
        self.patches = None

    def install(self) -> "ServedRows":
        from workbook.vllm import hookpoints
        from workbook.vllm.patching import PatchSet

        self.observer.install()
        runner = hookpoints.resolve().runner
        ps = PatchSet("served-rows", "trace")  # installed after the observer: outside it

        def before_add(orig):
            def add_requests(*a, **k):
                self.poll_control()
                return orig(*a, **k)
            return add_requests

        def after_sample(orig):
            def sample_tokens(*a, **k):
                out = orig(*a, **k)
                try:
                    self.flush()
                except Exception as e:  # evidence lost never breaks the engine
                    self.rc.errors.append(f"served flush: {type(e).__name__}: {e}"[:300])
                return out
            return sample_tokens

        ps.wrap(runner, "add_requests", before_add)
        ps.wrap(runner, "sample_tokens", after_sample)
        self.patches = ps.install()
        os.makedirs(self.out, exist_ok=True)
        return self

    def poll_control(self) -> None:
        path = os.path.join(self.folder, CONTROL)
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_mtime_ns, st.st_size)
        if key == self.control_stat:
            return
        self.control_stat = key
        try:
            with open(path) as f:
                ctl = json.load(f)
        except (OSError, ValueError):
            self.control_stat = None  # half-written: read again next step
            return
        want = ctl.get("constraint_fault") or "none"
        have = self.fault[0] if self.fault else "none"
        if want != have:
            if self.fault:
                self.fault[1].remove()
                self.fault = None
            if want != "none":
                from workbook.hooks import constraint_faults

                self.fault = (want, constraint_faults.inject(want))
        self.append([{"kind": "control", "seq": ctl.get("seq"), "constraint_fault": want}])

    def flush(self) -> None:
        rc = self.rc
        steps = rc.steps  # materializes the finished step
        lines = []
        regs = rc.registrations[self.written["registrations"]:]
        for r in regs:
            req = r.get("req_id")
            p = rc.params.get(req)
            lines.append({"kind": "registration", "registration": r, "req_id": req,
                          "params": None if p is None else asdict(p),
                          "prompt": rc.prompts.get(req), "markers": rc.markers.to_dict(),
                          "logprobs_mode": rc.logprobs_mode})
        lines += [{"kind": "step", **s} for s in steps[self.written["steps"]:]]
        for req in list(rc.params):
            rows = rc.prompt_rows(req)
            fresh = {q: r for q, r in rows.items() if (req, q) not in self.prompt_rows_sent}
            if fresh:
                self.prompt_rows_sent.update((req, q) for q in fresh)
                lines.append({"kind": "prompt_rows", "req_id": req,
                              "rows": {str(q): r for q, r in fresh.items()}})
        lines += [{"kind": "error", "error": e} for e in rc.errors[self.written["errors"]:]]
        self.written = {"steps": len(steps), "registrations": len(rc.registrations),
                        "errors": len(rc.errors)}
        self.append(lines)

    def append(self, lines: list[dict]) -> None:
        if not lines:
            return
        text = "".join(json.dumps(x, default=_plain) + "\n" for x in lines)
        with open(os.path.join(self.out, ROWS), "a") as f:
            f.write(text)


def _plain(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def install_from_dir(folder: str) -> ServedRows:
    return ServedRows(folder).install()
