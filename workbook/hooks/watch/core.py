"""The start-up watch's ``Watch`` object: what a boundary records, and the evidence it keeps.

``workbook.hooks.watch`` hooks the watch into vLLM and calls it; this module is what happens at
a boundary. At each one (``Watch.check``: after a wrapped method was entered, before it returns)
the watch reads the bytes of every watched tensor — the three marker tensors, the marker caches,
the scan positions, the budget's device view, and canary tensors (a known pattern) allocated
right before and after the state — and compares them with the previous boundary. A change is
*expected* only inside a method allowed to write that tensor (``startup.ALLOWED_WRITERS``: the
caches and the budget view in ``ThinkingBudgetState.apply`` / ``apply_staged_writes``); anything
else is recorded with the phase it happened in (``startup.classify`` of the frames common to the
last clean and the first dirty boundary), the values before and after, and whether the pointer
or ``_version`` moved. In ring mode (after the detailed steps) a boundary is one ``torch.cat`` of
the watched tensors into a device ring buffer, compared when the ring is flushed. The evidence:
``Watch.read()`` / ``Watch.to_dict()`` (schema ``workbook.watch/1``), written to
``out_dir/watch.json`` by ``Watch.write()``; the sanitizer stage and the layout evidence are the
watch's ``WatchProtection`` (``workbook.hooks.watch.protection``), called at these boundaries.

Not here: ``Options``, ``WatchError`` and the registry of this process's watches (pending,
bound by object id, active) in which the wrappers look up their watch
(``workbook.hooks.watch.registry``); anything that patches vLLM — the phase and ring-mode
wrappers, ``install``, ``suspend`` / ``resume``, the plugin path, the CPU profiling-run
emulation (``workbook.hooks.watch``, which re-exports the public names) — nor the localization's
hooks (``workbook.hooks.watch.localize``). Entering ring mode, ``Watch.step_finished`` calls
``watch_registry.ON_RING`` (the installer's slimming, registered there): no import back up.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from workbook.hooks.watch import evidence as watch_evidence
from workbook.hooks.watch.localize import Localization, stack_names
from workbook.hooks.watch.protection import WatchProtection
from workbook.hooks.watch.registry import (ACTIVE, BY_OBJ, CANARY, LOCK, ON_RING,  # noqa: F401
                                           PENDING, SCHEMA, STEP_BOUNDARIES, Options,
                                           WatchError, canary_i32, current, watch_for)
from workbook.vllm import startup

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
        # the sanitizer stage, its red zones and the layout evidence
        self.protection = WatchProtection(opts)
        self.pos_b: Boundary | None = None  # the last boundary (the position a write follows)
        self.n_modules = 0  # sys.modules' size at the last modules.json

    # -- binding ---------------------------------------------------------------------------
    def bind_runner(self, runner) -> None:
        self.runner = runner
        BY_OBJ[id(runner)] = self
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
        if self.protection.mode == "page":  # moved onto read-only pages before reading
            self.protection.attach(state, {}, self.position)
        if self.protection.mode == "nvtx":  # markers into padded buffers before reading
            self.protection.pad(state)
        tensors = startup.state_tensors(state, self.version)  # StateLayoutError names a gap
        self.busy = True  # no boundary while the watch itself reads the new state
        try:
            self._attach(state, tensors, pre, post)
            self.protection.neighbours("at_state_creation", self._tensors)
        finally:
            self.busy = False
        if self.protection.mode in ("nvtx", "api"):
            self.protection.attach(state, self.canaries, self.position)
        b = self.last[0]
        self._phase_seen(b, [])
        self._timeline(b, [], [])

    def _attach(self, state, tensors, pre, post) -> None:
        self.state = state
        BY_OBJ[id(state)] = self
        self.canaries = {f"canary.pre{i}": t for i, t in enumerate(pre)}
        self.canaries.update({f"canary.post{i}": t for i, t in enumerate(post)})
        self.names = list(tensors) + list(self.canaries)
        self.roles = {n: startup.STATE_TENSORS.get(n, "canary") for n in self.names}
        views = self._views()
        self.sizes = [v.numel() for v in views]
        self.inference = {n: _is_inference(t) for n, t in self._tensors().items()}
        row = self._gather_now()
        self.creation = {n: v.tolist() for n, v in self._split(row).items()}
        self.layout = watch_evidence.layout(
            self._tensors(),
            self.protection.zones.layout() if self.protection.zones is not None else None)
        b = self._boundary("created", "ThinkingBudgetState", level="phase")
        self.last = (b, row)

    # -- reading the watched bytes ---------------------------------------------------------
    def _tensors(self) -> dict:
        s = self.state
        out = {}
        for n in self.names:
            if n in self.canaries:
                out[n] = self.canaries[n]
            else:
                out[n] = startup.resolve_path(s, n)  # re-read: the budget's UVA view rotates
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
        self.pos_b = b
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
            common_q = set(stack_names(common))
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
        phase = startup.classify(stack_names(common), kv_ready=b.kv_ready, step=b.step)
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
            "path": " > ".join(stack_names(common)),
            "module": mods[-1][1] if mods else None,
            "op": ops[-1][1] if ops else None,
            "context": list(self.history[-12:]) if self.loc.active else [],
        }

    def _phase_seen(self, b: Boundary, unexpected: list[str]) -> None:
        name = startup.top_phase(startup.classify(stack_names(b.stack), kv_ready=b.kv_ready,
                                                  step=b.step))
        if name.startswith("step ") and b.step > self.opts.timeline_steps:
            name = f"steps {self.opts.timeline_steps + 1}+"
        p = self.phases.setdefault(name, {"phase": name, "first_t": round(b.t, 4),
                                          "boundaries": 0, "unexpected": 0})
        p["last_t"] = round(b.t, 4)
        p["boundaries"] += 1
        p["unexpected"] += len(unexpected)
        if b.step == 0 and self.platform == "cuda" and b.level == "phase":
            p["memory"] = watch_evidence.device_memory()  # at the phase's last boundary so far

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
            "phase": startup.classify(stack_names(b.stack), kv_ready=b.kv_ready, step=b.step),
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
                self.protection.neighbours("after_startup", self._tensors)
            self.protection.stop_history()
            self.write()
            for fn in list(ON_RING):  # the installer's (``workbook.hooks.watch``) slimming
                fn()
        if self.mode == "ring" and self.opts.flush_every_steps and \
                self.step % self.opts.flush_every_steps == 0:
            self.flush()
            self.write()

    # -- evidence --------------------------------------------------------------------------
    def read(self) -> dict:
        """The evidence so far (flushes the ring first)."""
        with LOCK:
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
                   "canaries_intact": all(bool((vals[n] == canary_i32()).all())
                                          for n in self.canaries),
                   "values": {n: _short(vals[n]) for n in self.names}}
        first_real = next((p for p in self.phases if p.startswith("step ")), None)
        return {
            "schema": SCHEMA, "pid": os.getpid(), "vllm_version": self.version,
            "platform": self.platform, "torch": torch.__version__,
            "device": watch_evidence.device_name(self.platform), "options": self.opts.to_dict(),
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
            "position": self.position(),
            "protection": self.protection.to_dict(),
            "layout_evidence": self.protection.layout_evidence,
        }

    def position(self) -> dict | None:
        """Where the watch is: its last boundary, the phase it lies in and the real steps
        started (a step with no boundary yet reads ``step N``). Under the sanitizer stage the
        evidence is written at every phase entry and step, so a write that ends the process
        lies after this boundary."""
        b = self.pos_b
        if b is None:
            return None
        phase = startup.classify(stack_names(b.stack), kv_ready=b.kv_ready, step=b.step)
        if self.step > b.step:
            phase = f"step {self.step}"
        return {"boundary": b.label(), "seq": b.seq, "step": self.step,
                "in_step": self.in_step, "phase": phase}

    def write(self) -> None:
        if not self.opts.out_dir:
            return
        try:
            os.makedirs(self.opts.out_dir, exist_ok=True)
            if self.protection.guard is not None:
                self.n_modules = watch_evidence.write_module_table(self.opts.out_dir,
                                                                   self.n_modules)
            path = os.path.join(self.opts.out_dir, "watch.json")
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.to_dict(), f, indent=1, default=str)
            os.replace(tmp, path)
        except Exception as e:  # never break the engine over evidence
            self.error = self.error or f"writing watch.json failed: {type(e).__name__}: {e}"

    def remove(self) -> None:
        """Stop watching this engine (its wrappers become pass-through)."""
        with LOCK:
            if self.removed:
                return
            self.flush()
            self.write()
            self.removed = True
            self.protection.detach()
            self.loc.finish("watch removed")
            for k in [k for k, w in BY_OBJ.items() if w is self]:
                del BY_OBJ[k]
            if self in PENDING:
                PENDING.remove(self)


# ---- helpers -------------------------------------------------------------------------------------

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
