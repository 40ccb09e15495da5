"""The row check inside a served engine (``vllm serve``): the grid's hooks, driven by files.

The plugin (``workbook.hooks.plugin``) calls ``install_from_dir(d)`` in a model-runner process
when ``WORKBOOK_ROW_CHECK_DIR=d`` is set. It installs the same collector an in-process grid cell
gets from ``workbook.hooks.install`` (``rowcheck.RowCheck`` in one ``observer.Observer``) and:

- before every ``GPUModelRunner.add_requests`` (each real step, before its requests register
  and before its forward), reads ``d/control.json`` (``{"seq": n, "constraint_fault": name,
  "lm_head": "natural" | "zero" | "scaled", "lm_head_factor": x}``) when it changed, installs
  that constraint fault (``constraint_faults.inject``), removing the previous one, and edits the
  worker's lm_heads as asked (``vllm.lmhead``; the previous edit written back first): the grid
  sends a faulted batch and then its healthy reference on the same server, on the batch's head;
  the control's ``steer`` (``[[prompt, plan], ...]``) replaces the drafter's proposals for those
  requests (``hooks.steer``, as in-process; a new plan set replaces the previous one);
- at the same point, the request ids vLLM's scheduler tells the runner it preempted
  (``scheduler_output.preempted_req_ids``, MRV2) are counted per request prompt;
- after every ``GPUModelRunner.sample_tokens`` (the step is over), materializes the row check's
  pending step (one host copy per step, as the served tracer's flush) and appends what is new —
  registrations (with each request's ``contracts.Params``, prompt, markers), step records,
  prompt rows, preemptions and steered draft rows per prompt (when they changed), errors — as
  JSON lines to ``d/<pid>/rows.jsonl``. Lines are appended before the
  step's output leaves the worker, so a request's records are on disk when its response arrives.

Deliberately not here: judging (``workbook.run.constraints.rowjudge`` over ``workbook.run.constraints.served``'s
reader), anything in the front-end or engine-core processes (the plugin does not touch them).
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
        from workbook.hooks.observe.observer import Observer
        from workbook.hooks.observe.rowcheck import RowCheck

        self.folder = folder
        self.rc = RowCheck()
        self.observer = Observer([self.rc])
        self.fault = None  # (name, PatchSet)
        self.runner = None  # the worker's model runner (seen at add_requests)
        self.head = ("natural", None)  # the lm_head edit in place: (name, factor)
        self.restore_head = None  # writes the original lm_head weights back
        self.steer = None  # (plans as JSON, hooks.steer.Steer) in place
        self.preempted: dict[tuple, int] = {}  # prompt -> preemptions the scheduler told
        self.sent_counts = ({}, {})  # preempted, steered: as last written
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
                self.runner = a[0] if a else self.runner
                so = a[1] if len(a) > 1 else k.get("scheduler_output")
                self.poll_control(so)
                self.count_preempted(so)
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

    def count_preempted(self, scheduler_output) -> None:
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            prompt = tuple(self.rc.prompts.get(rid) or ())
            self.preempted[prompt] = self.preempted.get(prompt, 0) + 1

    def poll_control(self, scheduler_output=None) -> None:
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
        self.preempted = {}  # a new batch: its own counts
        if self.steer is not None:
            self.steer[1].by_prompt.clear()
        want = ctl.get("constraint_fault") or "none"
        have = self.fault[0] if self.fault else "none"
        if want != have:
            if self.fault:
                self.fault[1].remove()
                self.fault = None
            if want != "none":
                from workbook.hooks.faults import constraints as constraint_faults

                self.fault = (want, constraint_faults.inject(want))
        head = ctl.get("lm_head") or "natural"
        factor = ctl.get("lm_head_factor")
        if (head, factor) != self.head:
            try:
                self.set_head(head, factor)
            except Exception as e:  # noqa: BLE001  (evidence of it, never the engine's end)
                self.rc.errors.append(f"lm_head {head}: {type(e).__name__}: {e}"[:300])
        plans = ctl.get("steer") or []
        if (self.steer[0] if self.steer else []) != plans:
            try:
                self.set_steer(plans, scheduler_output)
            except Exception as e:  # noqa: BLE001
                self.rc.errors.append(f"steer: {type(e).__name__}: {e}"[:300])
        self.append([{"kind": "control", "seq": ctl.get("seq"), "constraint_fault": want,
                      "lm_head": head, "steered_requests": len(plans)}])

    def set_steer(self, plans: list, scheduler_output) -> None:
        """The drafter steered for the requests ``plans`` names (the previous steer removed);
        this step's new requests register at once (the steer's own ``add_requests`` wrapper
        joins from the next step)."""
        from workbook.hooks.observe import steer as hsteer

        if self.steer is not None:
            self.steer[1].remove()
            self.steer = None
        if plans and self.runner is not None:
            st = hsteer.Steer(self.runner, {tuple(p): plan for p, plan in plans}).install()
            st.register(scheduler_output)
            self.steer = (plans, st)

    def set_head(self, head: str, factor) -> None:
        """The worker's lm_heads edited as ``head`` asks (the previous edit written back)."""
        from workbook.vllm import lmhead

        if self.restore_head is not None:
            self.restore_head()
        self.head, self.restore_head = ("natural", None), None
        fn = lmhead.edit_fn(head, factor)
        if fn is not None and self.runner is not None:
            self.restore_head = lmhead.apply(self.runner, fn)
            self.head = (head, factor)

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
        steered = dict(self.steer[1].by_prompt) if self.steer else {}
        for kind, counts, old in (("preempted", self.preempted, self.sent_counts[0]),
                                  ("steered", steered, self.sent_counts[1])):
            if counts != old:
                lines.append({"kind": kind, "counts": [[list(p), n] for p, n in counts.items()]})
        self.sent_counts = (dict(self.preempted), steered)
        if self.steer:
            rc.errors.extend(e for e in self.steer[1].errors if e not in rc.errors)
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
