"""The start-up watch: who changes ``ThinkingBudgetState``'s device tensors, in which phase.

vLLM #54906: on the reporter's Thor the markers of ``ThinkingBudgetState`` read ``[0]`` after
the initial profiling run, with storage and ``_version`` unchanged — an out-of-band writer that
memory histories and code reading did not find. The watch finds it:

1. **Snapshots at every phase boundary.** Installed *before* the engine starts (``install``:
   in-process before ``vllm.LLM(...)``, under ``vllm serve`` by the plugin at model-runner
   import), it wraps the start-up phase methods of ``workbook.vllm.startup`` (runner
   construction, model and drafter load, state creation, memory profiling, the profiling run's
   target forward / drafter propose / dummy sampler, KV-cache allocation, warm-up, CUDA-graph
   capture) and the step methods. At each boundary (after a method was entered, before it
   returns) it reads the bytes of every watched tensor — the three marker tensors, the marker
   caches, the scan positions, the budget's device view, and canary tensors (a known pattern)
   allocated right before and after the state — and compares them with the previous boundary.
   A change is *expected* only inside a method allowed to write that tensor
   (``startup.ALLOWED_WRITERS``: the caches and the budget view in
   ``ThinkingBudgetState.apply`` / ``apply_staged_writes``); anything else is recorded with the
   phase it happened in (``startup.classify`` of the frames common to the last clean and the
   first dirty boundary), the values before and after, and whether the pointer or ``_version``
   moved.
2. **Localization** (``localize="module"`` / ``"op"``, eager engines only). During start-up and
   the first ``localize_steps`` real steps, global module forward hooks add a boundary before
   and after every module forward (target and drafter modules named ``target.<qualname>`` /
   ``drafter.<qualname>``) and, at level ``op``, a ``TorchDispatchMode`` and a wrapper on
   Triton's launcher add one before and after every aten op / custom op / Triton launch
   (every ``op_stride``-th; inside ``localize_within`` only, if set). Each check synchronizes
   the device, so the first dirty boundary brackets the writer: the innermost frame common to
   the clean and the dirty boundary is the op (the writer), or the module (then the labels say
   between which ops: a write no aten op made), or the phase. Independently of values, an op
   that mutates memory overlapping a watched tensor through another tensor object (an alias)
   and a Triton launch handed a pointer into one are recorded by name. A time limit
   (``localize_timeout_s``) stops the fine levels and records what was narrowed down so far.
3. **Every step afterwards, cheaply.** After the first ``timeline_steps`` real steps (and the
   localized ones) the watch keeps only six boundaries per step (step start and end, around
   ``apply_staged_writes`` and ``apply``), each one ``torch.cat`` of the watched tensors into a
   device ring buffer — no host sync; the ring is copied and analysed when full, every
   ``flush_every_steps`` steps, and when the evidence is read.

Nothing the watch does changes what vLLM computes: it reads (copies into its own buffers),
allocates its canaries next to the state, and synchronizes only during start-up and
localization. With ``out_dir`` it writes ``out_dir/watch.json`` as it goes (end of each start-up
phase, first unexpected change, localization stop, ring flushes, exit), so a killed or timed-out
run still leaves what it found.

API: ``install(options) -> Watch`` (before the engine starts; the watch binds to the next
runner built in this process), ``Watch.read()`` (the evidence dict, after a flush),
``Watch.remove()``, ``install_from_dir(watch_dir)`` (the plugin: options from
``watch_dir/options.json``, evidence in ``watch_dir/<pid>/watch.json``), ``force_cpu_profile_run()``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from workbook.core.config import LOCALIZE
from workbook.hooks import protect
from workbook.hooks.localize import Localization, _frames, _stack_names
from workbook.vllm import startup
from workbook.vllm.patching import PatchSet

SCHEMA = "workbook.watch/1"
CANARY = 0x5AFEC0DE  # int32 pattern of the canary tensors
STEP_BOUNDARIES = {  # kept after the detailed steps (ring mode): they bracket the writers
    ("enter", "ThinkingBudgetState.apply_staged_writes"),
    ("exit", "ThinkingBudgetState.apply_staged_writes"),
    ("enter", "ThinkingBudgetState.apply"), ("exit", "ThinkingBudgetState.apply")}
OPTIONS_FILE = "options.json"


class WatchError(RuntimeError):
    """The watch cannot do what it was asked (named in the message)."""


@dataclass
class Options:
    out_dir: str | None = None  # write watch.json here as the watch goes
    localize: str = "none"  # none | module | op
    localize_within: str = ""  # op level only inside modules whose name starts with this
    localize_timeout_s: float = 600.0  # fine levels stop after this (start of localization)
    localize_steps: int = 8  # real steps localized after start-up
    op_stride: int = 1  # op level: check every n-th op / launch
    canaries: int = 2  # canary tensors on each side of the state (0: vLLM's layout untouched)
    timeline_steps: int = 3  # real steps with every boundary checked and kept in the timeline
    ring_rows: int = 512  # per-step ring buffer rows (boundaries) before a flush
    ring_stride: int = 4  # ring mode: record the boundaries of every n-th step only
    flush_every_steps: int = 0  # 0: when the ring is full or read; server runs use 1
    label: str = ""  # free text carried into the evidence (e.g. the run name)
    protect: str = "none"  # none | auto | nvtx | page: the state read-only (workbook.hooks.protect)

    def __post_init__(self):
        if self.localize not in LOCALIZE:
            raise WatchError(f"localize={self.localize!r}: choose one of {LOCALIZE}")
        if self.op_stride < 1:
            raise WatchError(f"op_stride={self.op_stride!r} must be >= 1")
        if self.ring_stride < 1:
            raise WatchError(f"ring_stride={self.ring_stride!r} must be >= 1")
        if self.protect not in protect.MODES:
            raise WatchError(f"protect={self.protect!r}: choose one of {protect.MODES}")

    @classmethod
    def from_dict(cls, d: dict) -> "Options":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- the watches of this process and how a wrapper finds its own ------------------------------

_pending: list["Watch"] = []  # installed, waiting for the next runner
_by_obj: dict[int, "Watch"] = {}  # id(runner / worker / state / speculator) -> watch
_active: list["Watch"] = []  # watches whose wrapped methods are running (innermost last)
_lock = threading.RLock()
_patches: PatchSet | None = None
_late: PatchSet | None = None  # worker classes and the speculator, wrapped at runner build


def _watch_for(obj) -> "Watch | None":
    w = _by_obj.get(id(obj))
    if w is not None:
        return w
    mr = getattr(obj, "model_runner", None)  # a worker
    if mr is not None:
        return _by_obj.get(id(mr))
    return None


def _current() -> "Watch | None":
    return _active[-1] if _active else None


# ---- a boundary --------------------------------------------------------------------------------

class Boundary:
    __slots__ = ("seq", "t", "kind", "where", "stack", "mods", "ops", "step", "kv_ready",
                 "level", "ptrs", "versions", "rebase")

    def label(self) -> str:
        return f"{self.kind} {self.where}"


class Watch:
    """One engine's watch: bound to the first runner built after ``install``."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.t0 = time.perf_counter()
        self.runner = None
        self.state = None
        self.version = "?"
        self.platform = None
        self.error: str | None = None
        self.enabled: bool | None = None
        self.names: list[str] = []
        self.roles: dict[str, str] = {}
        self.sizes: list[int] = []
        self.creation: dict[str, list] = {}
        self.canaries: dict[str, Any] = {}
        self.layout: list[dict] = []
        self.inference: dict[str, bool] = {}
        self.stack: list[tuple[int, str]] = []  # running wrapped methods (frame id, qualname)
        self.mods: list[tuple[int, str]] = []  # module forwards (localization)
        self.ops: list[tuple[int, str]] = []  # the op / launch being checked around
        self.kv_ready = False
        self.step = 0  # real steps started
        self.in_step = False
        self.busy = False
        self.seq = 0
        self.last: tuple[Boundary, Any] | None = None
        self.timeline: list[dict] = []
        self.changes: list[dict] = []
        self.expected = 0
        self.first: dict | None = None
        self.phases: dict[str, dict] = {}
        self.calls: dict[str, int] = {}
        self.history: list[str] = []  # recent boundary labels (localization context)
        self.checks = {"startup": 0, "steps": 0}
        self.check_s = {"startup": 0.0, "steps": 0.0}
        self.mode = "sync"
        self.ring = None
        self.ring_labels: list[Boundary] = []
        self.flushes = 0
        self.loc = Localization(self)
        self.modnames: dict[int, str] = {}
        self.speculator_class: str | None = None
        self.removed = False
        self.rebase = False  # the next boundary is a new baseline (after a suspension)
        self.protection: dict = {"mode": "none"}  # the sanitizer stage (workbook.hooks.protect)
        self.guard = None  # its PageGuard / NvtxGuard once the state exists
        self.layout_evidence: dict = {}  # neighbours of the watched blocks (protect.neighbours)

    # -- binding ---------------------------------------------------------------------------
    def bind_runner(self, runner) -> None:
        self.runner = runner
        _by_obj[id(runner)] = self
        import torch

        self.platform = "cuda" if torch.cuda.is_available() else "cpu"

    def attach_state(self, state, pre: list, post: list) -> None:
        """``ThinkingBudgetState.__init__`` returned: record its tensors and canaries."""
        import vllm

        self.version = vllm.__version__
        self.enabled = bool(getattr(state, "enabled", False))
        if not self.enabled:
            self.error = ("ThinkingBudgetState.enabled is False: nothing to watch (no marker "
                          "tensors; hypothesis H-b)")
            return
        if self.protection.get("mode") == "page":  # moved onto read-only pages before reading
            self._protect(state, {})
        tensors = startup.state_tensors(state, self.version)  # StateLayoutError names a gap
        self.busy = True  # no boundary while the watch itself reads the new state
        try:
            self._attach(state, tensors, pre, post)
            self.layout_evidence["at_state_creation"] = self._neighbours()
        finally:
            self.busy = False
        if self.protection.get("mode") == "nvtx":
            self._protect(state, self.canaries)
        b = self.last[0]
        self._phase_seen(b, [])
        self._timeline(b, [], [])

    def _attach(self, state, tensors, pre, post) -> None:
        self.state = state
        _by_obj[id(state)] = self
        self.canaries = {f"canary.pre{i}": t for i, t in enumerate(pre)}
        self.canaries.update({f"canary.post{i}": t for i, t in enumerate(post)})
        self.names = list(tensors) + list(self.canaries)
        self.roles = {n: startup.STATE_TENSORS.get(n, "canary") for n in self.names}
        views = self._views()
        self.sizes = [v.numel() for v in views]
        self.inference = {n: _is_inference(t) for n, t in self._tensors().items()}
        row = self._gather_now()
        self.creation = {n: v.tolist() for n, v in self._split(row).items()}
        self.layout = _layout(self._tensors())
        b = self._boundary("created", "ThinkingBudgetState", level="phase")
        self.last = (b, row)

    # -- the sanitizer stage (protection) and layout evidence ------------------------------
    def plan_protection(self, platform: str) -> None:
        """Before the engine starts: resolve ``opts.protect``; what the stage needs and lacks
        is named in the evidence and the stage skipped (the rest of the watch is intact)."""
        if platform == "cuda":  # allocation stacks for the layout evidence (start-up only)
            why = protect.record_history()
            self.protection["memory_history"] = why or "on during start-up (python stacks)"
        if self.opts.protect == "none":
            return
        mode = protect.resolve_mode(self.opts.protect, platform)
        req = protect.requirements(mode)
        if mode == "nvtx":  # compute-sanitizer runs the process; the shim needs the rest
            req["missing"] = [m for m in req["missing"] if m != "compute-sanitizer"] \
                if os.environ.get("WORKBOOK_UNDER_SANITIZER") else req["missing"]
            req["ok"] = not req["missing"]
        self.protection.update(mode=mode if req["ok"] else "skipped", asked=self.opts.protect,
                               missing=req["missing"], message=req["message"])
        if not req["ok"]:
            import sys

            print(f"workbook watch: {req['message']}", file=sys.stderr, flush=True)

    def _protect(self, state, canaries: dict) -> None:
        try:
            self.guard = protect.attach(self.protection["mode"], state,
                                        out_dir=self.opts.out_dir, canaries=canaries)
        except Exception as e:  # the stage is skipped, the watch goes on
            self.protection.update(mode="skipped", message=f"{type(e).__name__}: {e}")

    def _neighbours(self) -> dict:
        try:
            return protect.neighbours(self._tensors())
        except Exception as e:  # evidence only
            return {"error": f"{type(e).__name__}: {e}"}

    # -- reading the watched bytes ---------------------------------------------------------
    def _tensors(self) -> dict:
        s = self.state
        out = {}
        for n in self.names:
            if n in self.canaries:
                out[n] = self.canaries[n]
            else:
                out[n] = startup._resolve(s, n)  # re-read: the budget's UVA view rotates
        return out

    def _views(self) -> list:
        """int32 views of the watched tensors, in ``names`` order (cached; the budget's device
        view is re-read every time: vLLM's UVA pool rotates it)."""
        import torch

        def flat(t):
            if t.dim() == 1 and t.dtype == torch.int32 and t.is_contiguous():
                return t
            v = t.detach().reshape(-1)
            return v.contiguous().view(torch.int32) if v.element_size() % 4 == 0 \
                else v.to(torch.int32)

        cache = getattr(self, "_view_cache", None)
        if cache is None:
            cache = self._view_cache = [flat(t) for t in self._tensors().values()]
            self._budget_pos = self.names.index("thinking_token_budget.gpu") \
                if "thinking_token_budget.gpu" in self.names else None
        if self._budget_pos is not None:
            cache[self._budget_pos] = flat(self.state.thinking_token_budget.gpu)
        return cache

    def _gather(self, out=None):
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        modes = _disable_current_modes() if self.loc.active else contextlib.nullcontext()
        inf = contextlib.nullcontext() if torch.is_inference_mode_enabled() \
            else torch.inference_mode()
        with modes, inf:
            if out is None:
                return torch.cat(self._views())
            torch.cat(self._views(), out=out)
            return out

    def _gather_now(self):
        """Synchronize and copy the watched bytes to the host (numpy int32)."""
        import torch

        if self.platform == "cuda":
            torch.cuda.synchronize()
        row = self._gather()
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return row.cpu().numpy().copy()

    def _split(self, row) -> dict:
        out, i = {}, 0
        for n, k in zip(self.names, self.sizes):
            out[n] = row[i:i + k]
            i += k
        return out

    # -- boundaries ------------------------------------------------------------------------
    def _boundary(self, kind: str, where: str, level: str, light: bool = False) -> Boundary:
        b = Boundary()
        b.seq, b.t, b.kind, b.where, b.level = self.seq, time.perf_counter() - self.t0, kind, \
            where, level
        self.seq += 1
        b.stack, b.mods, b.ops = tuple(self.stack), tuple(self.mods), tuple(self.ops)
        b.step, b.kv_ready = self.step, self.kv_ready
        b.rebase, self.rebase = self.rebase, False
        if light:  # ring mode: no per-boundary host reads of pointers / versions
            b.ptrs = b.versions = {}
            return b
        ts = self._tensors() if self.state is not None else {}
        b.ptrs = {n: t.data_ptr() for n, t in ts.items()}
        b.versions = {n: _version_of(t, self.inference.get(n)) for n, t in ts.items()}
        return b

    def check(self, kind: str, where: str, level: str = "phase") -> None:
        """A boundary: compare the watched bytes with the previous boundary's."""
        if self.busy or self.removed:
            return
        if self.state is None:  # before state creation: the phase still counts as run
            if level == "phase":
                b = self._boundary(kind, where, level)
                self._phase_seen(b, [])
                self._timeline(b, [], [])
            return
        if level == "phase" and self.mode == "ring" and (kind, where) not in STEP_BOUNDARIES:
            return
        if _capturing():
            return
        self.busy = True
        t = time.perf_counter()
        phase_key = "steps" if self.step else "startup"
        try:
            ring = self.mode == "ring" and level == "phase"
            b = self._boundary(kind, where, level, light=ring)
            if ring:
                self._ring_record(b)
            else:
                row = self._gather_now()
                self._compare(b, row)
        finally:
            self.checks[phase_key] += 1
            self.check_s[phase_key] += time.perf_counter() - t
            self.busy = False

    def _compare(self, b: Boundary, row) -> list[dict]:
        import numpy as np

        prev_b, prev_row = self.last
        self.last = (b, row)
        # after a gap (a suspension, or steps ring_stride skipped) legitimate writes were not
        # bracketed: only tensors nobody may write (markers, canaries) are compared
        names = [n for n in self.names if not startup.ALLOWED_WRITERS.get(self.roles[n])] \
            if b.rebase else self.names
        if self.loc.active:
            self.history.append(b.label())
            del self.history[:-24]
        found, unexpected = [], []
        if not np.array_equal(prev_row, row):
            old, new = self._split(prev_row), self._split(row)
            common = _common(prev_b.stack, b.stack)
            common_q = set(_stack_names(common))
            for n in names:
                if np.array_equal(old[n], new[n]):
                    continue
                role = self.roles[n]
                allowed = startup.ALLOWED_WRITERS.get(role, ())
                exp = any(q in common_q for q in allowed)
                found.append(n)
                if exp:
                    self.expected += 1
                    continue
                ch = self._change(n, role, prev_b, b, old[n], new[n], common)
                unexpected.append(n)
                self.changes.append(ch)
                if self.first is None:
                    self.first = ch
                    self.loc.on_first_change(ch)
                    self.write()
        if b.level == "phase" or found:
            self._phase_seen(b, unexpected)
            if b.level == "phase" and (self.step <= self.opts.timeline_steps or unexpected):
                self._timeline(b, found, unexpected)
        return unexpected

    def _change(self, name, role, pb: Boundary, b: Boundary, old, new, common) -> dict:
        import numpy as np

        idx = np.flatnonzero(old != new)
        mods = _common(pb.mods, b.mods)
        ops = _common(pb.ops, b.ops)
        phase = startup.classify(_stack_names(common), kv_ready=b.kv_ready, step=b.step)
        if not common and not mods:
            phase = f"between phases ({pb.label()} → {b.label()})"
        if b.rebase and pb.step != b.step:
            phase = (f"between step {pb.step} and step {b.step} (the steps in between were "
                     f"not checked: ring_stride {self.opts.ring_stride}, or the watch was "
                     f"suspended)")
        return {
            "tensor": name, "role": role, "phase": phase, "top_phase": startup.top_phase(phase),
            "step": b.step, "t": round(b.t, 4), "seq": b.seq,
            "before": _short(old), "after": _short(new), "changed_at": idx[:8].tolist(),
            "n_changed": int(idx.size),
            "ptr_moved": None if not (pb.ptrs and b.ptrs) else pb.ptrs.get(name) != b.ptrs.get(name),
            "version": [pb.versions.get(name), b.versions.get(name)],
            "last_clean": pb.label(), "first_dirty": b.label(), "level": b.level,
            "path": " > ".join(_stack_names(common)),
            "module": mods[-1][1] if mods else None,
            "op": ops[-1][1] if ops else None,
            "context": list(self.history[-12:]) if self.loc.active else [],
        }

    def _phase_seen(self, b: Boundary, unexpected: list[str]) -> None:
        name = startup.top_phase(startup.classify(_stack_names(b.stack), kv_ready=b.kv_ready,
                                                  step=b.step))
        if name.startswith("step ") and b.step > self.opts.timeline_steps:
            name = f"steps {self.opts.timeline_steps + 1}+"
        p = self.phases.setdefault(name, {"phase": name, "first_t": round(b.t, 4),
                                          "boundaries": 0, "unexpected": 0})
        p["last_t"] = round(b.t, 4)
        p["boundaries"] += 1
        p["unexpected"] += len(unexpected)

    def _timeline(self, b: Boundary, found, unexpected) -> None:
        row = self.last[1] if self.last and self.state is not None else None
        mk = {}
        if row is not None:
            vals = self._split(row)
            mk = {n.split("_token_ids")[0].replace("reasoning_", ""): vals[n][:4].tolist()
                  for n in self.names if self.roles[n] == "marker"}
        self.timeline.append({
            "seq": b.seq, "t": round(b.t, 4), "kind": b.kind, "where": b.where,
            "depth": len(b.stack) - (1 if b.kind in ("enter", "exit") else 0),
            "phase": startup.classify(_stack_names(b.stack), kv_ready=b.kv_ready, step=b.step),
            "markers": mk, "changed": found, "unexpected": unexpected})

    # -- ring mode (every step after the detailed ones) ---------------------------------------
    def _ring_record(self, b: Boundary) -> None:
        import torch

        if self.ring is None:
            with torch.inference_mode():
                self.ring = torch.empty((self.opts.ring_rows, sum(self.sizes)),
                                        dtype=torch.int32, device=self._views()[0].device)
        if len(self.ring_labels) >= self.ring.shape[0]:
            self.flush()
        self._gather(out=self.ring[len(self.ring_labels)])
        self.ring_labels.append(b)

    def flush(self) -> None:
        """Analyse the ring (one copy to the host, a sync)."""
        if self.ring is None or not self.ring_labels:
            return
        from torch.utils._python_dispatch import _disable_current_modes

        t = time.perf_counter()
        with _disable_current_modes():
            rows = self.ring[:len(self.ring_labels)].cpu().numpy()
        labels, self.ring_labels = self.ring_labels, []
        for b, row in zip(labels, rows):
            self._compare(b, row)
        self.flushes += 1
        self.checks["steps"] += 1
        self.check_s["steps"] += time.perf_counter() - t

    # -- step bookkeeping ------------------------------------------------------------------
    def step_started(self) -> None:
        self.step += 1
        self.in_step = True

    def step_finished(self) -> None:
        self.in_step = False
        if self.step == 1 or (self.mode == "sync" and self.step <= self.opts.timeline_steps):
            self.write()
        detailed = max(self.opts.timeline_steps,
                       self.opts.localize_steps if self.loc.wanted else 0)
        if self.mode == "sync" and self.step >= detailed:
            self.loc.finish("start-up and the first %d real step(s) localized" % self.step)
            self.mode = "ring"
            if self.state is not None:
                self.layout_evidence["after_startup"] = self._neighbours()
            protect.stop_history()
            self.write()
            _slim()
        if self.mode == "ring" and self.opts.flush_every_steps and \
                self.step % self.opts.flush_every_steps == 0:
            self.flush()
            self.write()

    # -- evidence --------------------------------------------------------------------------
    def read(self) -> dict:
        """The evidence so far (flushes the ring first)."""
        with _lock:
            if not self.busy:
                self.flush()
            return self.to_dict()

    def to_dict(self) -> dict:
        import torch

        end = None
        if self.last is not None and self.state is not None:
            vals = self._split(self.last[1])
            end = {"markers_intact": all(vals[n].tolist() == self.creation[n] for n in self.names
                                         if self.roles[n] == "marker"),
                   "canaries_intact": all(bool((vals[n] == _canary_i32()).all())
                                          for n in self.canaries),
                   "values": {n: _short(vals[n]) for n in self.names}}
        first_real = next((p for p in self.phases if p.startswith("step ")), None)
        return {
            "schema": SCHEMA, "pid": os.getpid(), "vllm_version": self.version,
            "platform": self.platform, "torch": torch.__version__,
            "device": _device_name(self.platform), "options": self.opts.to_dict(),
            "startup_observed": True, "bound": self.runner is not None,
            "state_found": self.state is not None, "enabled": self.enabled, "error": self.error,
            "speculator_class": self.speculator_class,
            "tensors": [{"name": n, "role": self.roles[n], "numel": k,
                         "creation": _short(self.creation.get(n, []))}
                        for n, k in zip(self.names, self.sizes)],
            "layout": self.layout,
            "calls": dict(self.calls),
            "phases": list(self.phases.values()),
            "phase_order": [p for p in self.phases],
            "first_real_step_phase": first_real,
            "timeline": self.timeline,
            "changes": self.changes[:200], "n_changes": len(self.changes),
            "expected_changes": self.expected,
            "first_change": self.first,
            "localization": self.loc.to_dict(),
            "steps": {"real_steps": self.step, "mode": self.mode, "ring_flushes": self.flushes,
                      "ring_stride": self.opts.ring_stride},
            "overhead": {"startup_checks": self.checks["startup"],
                         "startup_check_s": round(self.check_s["startup"], 4),
                         "step_checks": self.checks["steps"],
                         "step_check_s": round(self.check_s["steps"], 4)},
            "state_at_end": end,
            "protection": {**self.protection,
                           **(self.guard.to_dict() if self.guard is not None else {})},
            "layout_evidence": self.layout_evidence,
        }

    def write(self) -> None:
        if not self.opts.out_dir:
            return
        try:
            os.makedirs(self.opts.out_dir, exist_ok=True)
            path = os.path.join(self.opts.out_dir, "watch.json")
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.to_dict(), f, indent=1, default=str)
            os.replace(tmp, path)
        except Exception as e:  # never break the engine over evidence
            self.error = self.error or f"writing watch.json failed: {type(e).__name__}: {e}"

    def remove(self) -> None:
        """Stop watching this engine (its wrappers become pass-through)."""
        with _lock:
            if self.removed:
                return
            self.flush()
            self.write()
            self.removed = True
            if self.guard is not None:
                protect.detach(self.guard)
            self.loc.finish("watch removed")
            for k in [k for k, w in _by_obj.items() if w is self]:
                del _by_obj[k]
            if self in _pending:
                _pending.remove(self)


# ---- helpers -------------------------------------------------------------------------------------

def _canary_i32() -> int:
    import numpy as np

    return int(np.array([CANARY], dtype=np.uint32).view(np.int32)[0])


def _short(v, n: int = 8) -> list:
    v = list(v.tolist() if hasattr(v, "tolist") else v)
    return v[:n] + (["…"] if len(v) > n else [])


def _common(a, b) -> tuple:
    out = []
    for x, y in zip(a, b):
        if x != y:
            break
        out.append(x)
    return tuple(out)


def _version_of(t, inference: bool | None):
    if inference:
        return None
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter
        return None


def _is_inference(t) -> bool:
    try:
        return bool(t.is_inference())
    except Exception:
        return False


def _capturing() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def _device_name(platform) -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if platform == "cuda" else "cpu"
    except Exception:
        return None


def _layout(tensors: dict) -> list[dict]:
    rows = sorted((t.data_ptr(), n, t.numel() * t.element_size()) for n, t in tensors.items())
    base = rows[0][0] if rows else 0
    return [{"name": n, "ptr": p, "ptr_hex": hex(p), "nbytes": k, "offset": p - base,
             "device": str(tensors[n].device)} for p, n, k in rows]


# ---- the wrappers ----------------------------------------------------------------------------------

def _phase_wrapper(qual: str, find):
    """``make(orig)`` for a phase method: boundaries at entry (after push) and exit."""

    def make(orig):
        @functools.wraps(orig)
        def wrapper(self, *a, **k):
            w = find(self, a)
            if w is None or w.removed:
                return orig(self, *a, **k)
            return _run_in_phase(w, qual, orig, self, a, k)
        wrapper.__watch_qual__ = qual
        return wrapper

    return make


def _run_in_phase(w: Watch, qual: str, orig, self, a, k):
    if qual.endswith(".execute_model") and not w.in_step and startup.is_real_step(
            a[0] if a else k.get("scheduler_output"), k):
        w.step_started()
    w.calls[qual] = w.calls.get(qual, 0) + 1
    w.stack.append((next(_frames), qual))
    _active.append(w)
    depth0 = len(w.stack) == 1
    try:
        w.check("enter", qual)
        if w.guard is not None and w.step == 0:  # a refused write ends the process: the
            w.write()                             # evidence names the phase it entered last
        with (w.loc.around() if depth0 or not w.loc.active else contextlib.nullcontext()):
            res = orig(self, *a, **k)
        w.check("exit", qual)
        return res
    finally:
        _active.pop()
        w.stack.pop()
        if qual == "GPUModelRunner.initialize_kv_cache":
            w.kv_ready = True
        if qual.endswith(".sample_tokens") and w.in_step and \
                not any(q.endswith(".sample_tokens") for _, q in w.stack):
            w.step_finished()
        if depth0 and w.step == 0:
            w.write()


def _find_runner(self, a):
    return _by_obj.get(id(self))


def _find_worker(self, a):
    return _watch_for(self)


def _find_current(self, a):
    return _by_obj.get(id(self)) or _current()


def _runner_init(orig):
    @functools.wraps(orig)
    def __init__(self, *a, **k):
        with _lock:
            w = _pending.pop(0) if _pending else None
        if w is None:
            return orig(self, *a, **k)
        w.bind_runner(self)
        res = _run_in_phase(w, "GPUModelRunner.__init__", orig, self, a, k)
        _late_wrap(self)
        spec = getattr(self, "speculator", None)
        if spec is not None:
            _by_obj[id(spec)] = w
            w.speculator_class = f"{type(spec).__module__}.{type(spec).__qualname__}"
        return res
    return __init__


def _state_init(orig):
    @functools.wraps(orig)
    def __init__(self, req_states, *a, **k):
        w = _current()
        if w is None or w.removed or w.state is not None:
            return orig(self, req_states, *a, **k)
        import torch

        dev = req_states.device
        n = max(64, int(req_states.max_num_reqs))

        def canaries():
            with torch.inference_mode():
                return [torch.full((n,), _canary_i32(), dtype=torch.int32, device=dev)
                        for _ in range(w.opts.canaries)]

        pre = canaries()
        w.stack.append((next(_frames), "ThinkingBudgetState.__init__"))
        try:
            res = orig(self, req_states, *a, **k)
        finally:
            w.stack.pop()
        post = canaries()
        w.calls["ThinkingBudgetState.__init__"] = 1
        w.attach_state(self, pre, post)
        w.write()
        return res
    return __init__


def _func_wrapper(mod, name: str):
    orig = getattr(mod, name)
    qual = f"{name}()"

    @functools.wraps(orig)
    def wrapper(*a, **k):
        w = _watch_for(a[0]) if a else None
        if w is None or w.removed:
            return orig(*a, **k)
        return _run_in_phase(w, qual, lambda _s, *aa, **kk: orig(*aa, **kk), None, a, k)
    return orig, wrapper


_func_patches: list = []


def _late_wrap(runner) -> None:
    """At the first watched runner's construction: worker classes (their modules finished
    importing by now), gpu_worker's warm-up functions, the speculator's class, module names."""
    global _late
    import sys

    if _late is None:
        ps = PatchSet("watch:late", "watch")
        for modname, clsname, methods in startup.WORKER_PHASES:
            mod = sys.modules.get(modname)
            cls = getattr(mod, clsname, None) if mod is not None else None
            if cls is None:
                continue
            for m in methods:
                if m in cls.__dict__:
                    ps.wrap(cls, m, _phase_wrapper(f"{clsname}.{m}", _find_worker))
        for modname, funcs in startup.WORKER_FUNCS:
            mod = sys.modules.get(modname)
            for f in funcs if mod is not None else ():
                if callable(getattr(mod, f, None)):
                    orig, wrapper = _func_wrapper(mod, f)
                    setattr(mod, f, wrapper)
                    _func_patches.append((mod, f, orig, wrapper))
        _late = ps.install()
    spec = getattr(runner, "speculator", None)
    if spec is not None:
        for m in startup.SPECULATOR_METHODS:
            for klass in type(spec).__mro__:
                if m in klass.__dict__:
                    if not getattr(klass.__dict__[m], "__watch_qual__", None):
                        _late.wrap(klass, m, _phase_wrapper(f"{startup.SPECULATOR}.{m}",
                                                            _find_runner))
                    break


def _name_modules(w: Watch, runner) -> None:
    for prefix, root in (("target", getattr(runner, "model", None)),
                         ("drafter", getattr(getattr(runner, "speculator", None), "model", None))):
        if root is None or not hasattr(root, "named_modules"):
            continue
        for n, m in root.named_modules():
            w.modnames.setdefault(id(m), f"{prefix}.{n}" if n else prefix)


def _after_load(orig):
    @functools.wraps(orig)
    def load_model(self, *a, **k):
        res = orig(self, *a, **k)
        w = _by_obj.get(id(self))
        if w is not None:
            _name_modules(w, self)
        return res
    return load_model


def _patch_set() -> PatchSet:
    """The class-level wrappers (built once per process; shared by every watch)."""
    global _patches
    if _patches is not None:
        return _patches
    import importlib

    ps = PatchSet("watch", "watch")
    runner_cls = None
    for modname, clsname, methods in startup.RUNNER_PHASES:
        try:
            cls = getattr(importlib.import_module(modname), clsname)
        except Exception:  # e.g. the CPU runner on a GPU build
            continue
        if clsname == "GPUModelRunner":
            runner_cls = cls
        finder = _find_current if clsname in ("Sampler", "ThinkingBudgetState") else _find_runner
        for m in methods:
            if m not in cls.__dict__:
                continue
            if (clsname, m) == ("GPUModelRunner", "__init__"):
                ps.wrap(cls, m, _runner_init)
            else:
                ps.wrap(cls, m, _phase_wrapper(f"{clsname}.{m}", finder))
    if runner_cls is None:
        raise WatchError("vLLM's MRV2 runner (vllm.v1.worker.gpu.model_runner.GPUModelRunner) "
                         "is missing: the watch needs Model Runner V2")
    from vllm.v1.worker.gpu.sample import thinking_budget as tbm

    ps.wrap(tbm.ThinkingBudgetState, "__init__", _state_init)
    ps.wrap(runner_cls, "load_model", _after_load)
    _patches = ps
    return ps


def install(opts: Options | None = None, **kw) -> Watch:
    """Install the watch for the next engine this process starts (before ``vllm.LLM``)."""
    import vllm

    opts = opts or Options(**kw)
    from vllm.v1.worker.gpu.sample import thinking_budget as tbm

    startup.check_state_class(tbm.ThinkingBudgetState, vllm.__version__)
    ps = _patch_set()
    _full_in()  # a start-up to watch: every phase wrapper (also after a slim phase)
    ps.install()
    w = Watch(opts)
    w.version = vllm.__version__
    import torch

    w.plan_protection("cuda" if torch.cuda.is_available() else "cpu")
    with _lock:
        _pending.append(w)
    atexit.register(w.write)
    return w


_ring_patches: PatchSet | None = None  # after start-up: only the budget state's writers


def _ring_wrapper(qual: str, enter_step: bool):
    def make(orig):
        @functools.wraps(orig)
        def wrapper(self, *a, **k):
            w = _by_obj.get(id(self))
            if w is None or w.removed or w.mode != "ring":
                return orig(self, *a, **k)
            if enter_step:
                w.step += 1
            if w.step % w.opts.ring_stride:  # a step not checked: the next check rebases
                w.rebase = True
                return orig(self, *a, **k)
            frame = (next(_frames), qual)
            w.stack.append(frame)
            try:
                w.check("enter", qual)
                res = orig(self, *a, **k)
                w.check("exit", qual)
            finally:
                w.stack.pop()
            if not enter_step and w.opts.flush_every_steps and \
                    w.step % w.opts.flush_every_steps == 0:
                w.flush()
                w.write()
            return res
        return wrapper
    return make


def _slim() -> None:
    """Once every watch of the process is past its detailed steps: swap the full set of
    wrappers for two (``apply_staged_writes`` — which also counts the steps — and ``apply``),
    so a step pays for four ring records and two Python wrappers, nothing else."""
    global _ring_patches
    ws = watches()
    if _pending or not ws or any(w.mode != "ring" for w in ws if not w.removed):
        return
    if _ring_patches is None:
        from vllm.v1.worker.gpu.sample import thinking_budget as tbm

        ps = PatchSet("watch:ring", "watch")
        ps.wrap(tbm.ThinkingBudgetState, "apply_staged_writes",
                _ring_wrapper("ThinkingBudgetState.apply_staged_writes", True))
        ps.wrap(tbm.ThinkingBudgetState, "apply", _ring_wrapper("ThinkingBudgetState.apply",
                                                                 False))
        _ring_patches = ps
    _full_out()
    _ring_patches.install()


def _full_out() -> None:
    if _late is not None:
        _late.remove()
    if _patches is not None:
        _patches.remove()
    for mod, f, orig, _wrapper in _func_patches:
        setattr(mod, f, orig)


def _full_in() -> None:
    if _ring_patches is not None:
        _ring_patches.remove()
    if _patches is not None:
        _patches.install()
    if _late is not None:
        _late.install()
    for mod, f, _orig, wrapper in _func_patches:
        setattr(mod, f, wrapper)


def suspend() -> None:
    """Take every watch wrapper out (the watches keep their evidence; benchmarks compare
    watched and unwatched steps of one engine). ``resume()`` puts them back."""
    global _suspended
    for w in watches():
        with _lock:
            w.flush()
            w.rebase = True
    _suspended = "ring" if _ring_patches is not None and _ring_patches.installed else "full"
    _full_out()
    if _ring_patches is not None:
        _ring_patches.remove()


_suspended: str | None = None


def resume() -> None:
    if _suspended == "ring":
        _ring_patches.install()
    elif _suspended == "full":
        _full_in()


def watches() -> list[Watch]:
    return list({id(w): w for w in _by_obj.values()}.values())


# ---- the plugin path -------------------------------------------------------------------------------

def write_options(watch_dir: str, opts: dict) -> str:
    os.makedirs(watch_dir, exist_ok=True)
    path = os.path.join(watch_dir, OPTIONS_FILE)
    with open(path, "w") as f:
        json.dump(opts, f, indent=1)
    return path


def install_from_dir(watch_dir: str) -> Watch:
    """Inside a vLLM process (the plugin): options from ``watch_dir/options.json``, evidence
    into ``watch_dir/<pid>/watch.json``."""
    path = os.path.join(watch_dir, OPTIONS_FILE)
    raw = {}
    if os.path.exists(path):
        with open(path) as f:
            raw = json.load(f)
    opts = Options.from_dict(raw)
    opts.out_dir = os.path.join(watch_dir, str(os.getpid()))
    if not opts.flush_every_steps:
        opts.flush_every_steps = 1  # the server's engine process is killed at shutdown
    return install(opts)


def read_dir(watch_dir: str) -> dict | None:
    """The evidence a served engine wrote (the process whose watch found the state)."""
    best = None
    if not os.path.isdir(watch_dir):
        return None
    for d in sorted(os.listdir(watch_dir)):
        p = os.path.join(watch_dir, d, "watch.json")
        if not os.path.exists(p):
            continue
        try:
            with open(p) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if best is None or (data.get("state_found") and not best.get("state_found")):
            best = data
    return best


# ---- CPU platform: the profiling run the GPU worker always does ------------------------------------

_cpu_profile: PatchSet | None = None


def force_cpu_profile_run() -> PatchSet | None:
    """vLLM 0.30+ on CPU skips ``profile_run`` with eager mode and an explicit KV-cache size;
    the GPU worker always runs it. This makes ``CPUWorker._should_warm_up_model()`` answer
    True (a platform emulation recorded in the evidence; vLLM 0.29's CPU worker always runs
    it). None where the method does not exist."""
    global _cpu_profile
    if _cpu_profile is not None:
        return _cpu_profile.install()
    try:
        from vllm.v1.worker.cpu_worker import CPUWorker
    except Exception:
        return None
    if "_should_warm_up_model" not in CPUWorker.__dict__:
        return None
    ps = PatchSet("cpu-profile-run", "fault")
    ps.wrap(CPUWorker, "_should_warm_up_model", lambda orig: (lambda self: True))
    _cpu_profile = ps
    return ps.install()
