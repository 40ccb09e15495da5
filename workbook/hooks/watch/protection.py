"""The sanitizer stage as the start-up watch runs it: planned, attached, detached, its evidence.

One ``WatchProtection`` per ``Watch`` (``workbook.hooks.watch.core``), in the order the watch
meets it: ``plan(platform)`` before the engine starts resolves ``opts.protect`` (``auto``: nvtx
on a GPU, the page twin on CPU) and names what the stage needs and lacks — then the stage is
skipped and the rest of the watch is intact; on a GPU it turns PyTorch's memory history on for
the layout evidence. When ``ThinkingBudgetState`` exists: ``pad`` moves the markers into padded
buffers (nvtx: ``workbook.hooks.watch.redzone``), ``attach`` makes the state read-only
(``workbook.hooks.watch.protect``: before the watch reads it in the page form, after in the nvtx and
api forms). ``neighbours`` records the watched blocks' layout (``workbook.hooks.watch.layout``)
at state creation and after start-up; ``detach`` gives the permissions back. ``to_dict`` is
watch.json's ``protection`` record (the plan, the guard's own record).

Deliberately not here: the permissions and the shim themselves (``workbook.hooks.watch.protect``),
reading or comparing the watched bytes (``workbook.hooks.watch.core``), running
compute-sanitizer or naming the writer (``workbook.run.writer.stage``, ``workbook.run.writer.sanitizer``).
A failure here is evidence, never an engine failure: the stage is skipped and says why.
"""

from __future__ import annotations

import os
import sys

from workbook.hooks.watch import layout as alloc_layout
from workbook.hooks.watch import protect
from workbook.hooks.watch import redzone


class WatchProtection:
    """The sanitizer stage of one watch: the plan (``record``), the guard once attached, the
    markers' red zones and the layout evidence."""

    def __init__(self, opts):
        self.opts = opts  # the watch's Options: protect (none | auto | nvtx | page | api), out_dir
        self.record: dict = {"mode": "none"}
        self.guard = None  # its PageGuard / NvtxGuard / ApiGuard once the state exists
        self.zones = None  # the markers' red zones (nvtx: workbook.hooks.watch.redzone)
        self.layout_evidence: dict = {}  # the watched blocks' neighbours (alloc_layout)

    @property
    def mode(self) -> str:
        return self.record.get("mode", "none")

    def plan(self, platform: str) -> None:
        """Before the engine starts: resolve the mode; what the stage needs and lacks is named
        in the evidence and the stage skipped (the rest of the watch is intact)."""
        if platform == "cuda":  # allocation stacks for the layout evidence (start-up only)
            why = alloc_layout.record_history()
            self.record["memory_history"] = why or "on during start-up (python stacks)"
        if self.opts.protect == "none":
            return
        mode = protect.resolve_mode(self.opts.protect, platform)
        req = protect.requirements(mode)
        if mode == "nvtx":  # compute-sanitizer runs the process; the shim needs the rest
            req["missing"] = [m for m in req["missing"] if m != "compute-sanitizer"] \
                if os.environ.get("WORKBOOK_UNDER_SANITIZER") else req["missing"]
            req["ok"] = not req["missing"]
        self.record.update(mode=mode if req["ok"] else "skipped", asked=self.opts.protect,
                           missing=req["missing"], message=req["message"])
        if not req["ok"]:
            print(f"workbook watch: {req['message']}", file=sys.stderr, flush=True)

    def pad(self, state) -> None:
        """Red zones around the markers (``workbook.hooks.watch.redzone``); what fails is recorded
        and the markers stay where vLLM put them."""
        try:
            self.zones = redzone.pad(state)
            if self.zones is None:
                self.record["redzones"] = f"off ({redzone.ENV}=0)"
        except Exception as e:  # evidence only: the protection goes on without red zones
            self.record["redzones"] = f"not set up: {type(e).__name__}: {e}"

    def attach(self, state, canaries: dict, where) -> None:
        """The state read-only in the planned form; ``where`` gives the watch's position."""
        try:
            self.guard = protect.attach(self.mode, state, out_dir=self.opts.out_dir,
                                        canaries=canaries, where=where, zones=self.zones)
        except Exception as e:  # the stage is skipped, the watch goes on
            self.record.update(mode="skipped", message=f"{type(e).__name__}: {e}")

    def neighbours(self, when: str, tensors) -> None:
        """The layout evidence ``when`` (``tensors()``: the watched tensors by name)."""
        try:
            self.layout_evidence[when] = alloc_layout.neighbours(tensors())
        except Exception as e:  # evidence only
            self.layout_evidence[when] = {"error": f"{type(e).__name__}: {e}"}

    def stop_history(self) -> None:
        """After start-up: no more allocation records (they would cost every step)."""
        alloc_layout.stop_history()

    def detach(self) -> None:
        if self.guard is not None:
            protect.detach(self.guard)

    def to_dict(self) -> dict:
        return {**self.record, **(self.guard.to_dict() if self.guard is not None else {})}
