"""Writer localization for the start-up watch: module / op / launch boundaries.

While the engine starts (and for the first real steps), ``Localization.around()`` puts global
module forward hooks in place and, at level ``op``, a ``TorchDispatchMode`` and a wrapper on
Triton's launcher; each adds a watch check (``Watch.check``) before and after every module
forward / aten op / Triton launch, so the first dirty check brackets the writer (see
``workbook.hooks.watch``, point 2). Independently of values, an op that mutates memory
overlapping a watched tensor through another tensor object (an alias) and a Triton launch handed
a pointer into one are recorded by name. A time limit stops the fine levels and keeps what was
narrowed down so far.

Split out of ``workbook.hooks.watch`` (the watch's boundaries and evidence are in
``workbook.hooks.watch.core``); this module only reads the watch's state and calls
``Watch.check``.
"""

from __future__ import annotations

import contextlib
import itertools
import time

from workbook.vllm import startup
from workbook.vllm.patching import PatchSet

frame_ids = itertools.count()  # frame ids of the wrapped-call / module / op stacks (shared)


def stack_names(frames) -> list[str]:
    return [q for _, q in frames]


class Localization:
    """Module / op / launch boundaries while the engine starts (and the first real steps)."""

    def __init__(self, w):  # a workbook.hooks.watch.Watch
        self.w = w
        self.level = w.opts.localize
        self.wanted = self.level != "none"
        self.active = False  # hooks in place right now (inside a depth-0 wrapped call)
        self.done = not self.wanted
        self.started: float | None = None
        self.stopped: str | None = None
        self.ops_seen = 0
        self.alias_writes: list[dict] = []
        self.launches: list[dict] = []
        self.checks = 0
        self.culprit: dict | None = None

    def timed_out(self) -> bool:
        if self.started is None:
            self.started = time.perf_counter()
        if time.perf_counter() - self.started > self.w.opts.localize_timeout_s:
            self.finish(f"time limit of {self.w.opts.localize_timeout_s:.0f} s reached after "
                        f"{self.checks} checks at {self.w.history[-1] if self.w.history else '-'}"
                        f"; narrowed down to what is recorded here")
            return True
        return False

    def finish(self, why: str) -> None:
        if not self.done:
            self.done = True
            self.stopped = why
            self.w.write()

    def on_first_change(self, ch: dict) -> None:
        if self.wanted:
            self.culprit = {k: ch[k] for k in ("tensor", "phase", "module", "op", "last_clean",
                                                "first_dirty", "level")}

    @contextlib.contextmanager
    def around(self):
        """Hooks in place for one depth-0 wrapped call (clean nesting with other modes)."""
        if self.done or self.active:
            yield
            return
        self.active = True
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(_module_hooks(self))
            if self.level == "op":
                stack.enter_context(_op_mode(self))
                stack.enter_context(_launch_hooks(self))
            with stack:
                yield
        finally:
            self.active = False

    def module_name(self, mod) -> str:
        return self.w.modnames.get(id(mod)) or type(mod).__name__

    def op_wanted(self) -> bool:
        within = self.w.opts.localize_within
        return not within or any(m.startswith(within) for _, m in self.w.mods)

    def to_dict(self) -> dict:
        return {"level": self.level, "within": self.w.opts.localize_within or None,
                "op_stride": self.w.opts.op_stride, "complete": self.done and self.stopped is not
                None and not self.stopped.startswith("time limit"),
                "stopped": self.stopped or (None if not self.wanted else
                                            f"still localizing when read (start-up and "
                                            f"{self.w.step} real step(s) so far)"),
                "checks": self.checks,
                "elapsed_s": None if self.started is None else
                round(time.perf_counter() - self.started, 3),
                "culprit": self.culprit, "alias_writes": self.alias_writes[:50],
                "suspect_launches": self.launches[:50]}


@contextlib.contextmanager
def _module_hooks(loc: Localization):
    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)

    w = loc.w

    def pre(mod, args):
        if w.busy or loc.done:
            return
        name = loc.module_name(mod)
        w.mods.append((next(frame_ids), name))
        if w.state is not None and not loc.timed_out():
            loc.checks += 1
            w.check("mod-enter", name, level="module")

    def post(mod, args, out):
        if w.busy or not w.mods:
            return
        name = loc.module_name(mod)
        if w.state is not None and not loc.done and not loc.timed_out():
            loc.checks += 1
            w.check("mod-exit", name, level="module")
        if w.mods and w.mods[-1][1] == name:
            w.mods.pop()

    h1 = register_module_forward_pre_hook(pre)
    h2 = register_module_forward_hook(post)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        w.mods.clear()


def _overlaps(w, t) -> str | None:
    """The watched tensor whose bytes ``t`` overlaps, if any."""
    try:
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
    except Exception:
        return None
    if hi <= lo:
        return None
    for n, wt in w._tensors().items():
        a = wt.data_ptr()
        b = a + wt.numel() * wt.element_size()
        if lo < b and a < hi:
            return n
    return None


def _mutated_args(func, args, kwargs):
    try:
        schema = func._schema
    except Exception:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        ai = a.alias_info
        if ai is None or not ai.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if v is not None and hasattr(v, "data_ptr"):
            out.append(v)
    return out


@contextlib.contextmanager
def _op_mode(loc: Localization):
    from torch.utils._python_dispatch import TorchDispatchMode

    w = loc.w

    class OpWatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if w.busy or loc.done or w.state is None or not loc.op_wanted() or \
                    (w.ops and w.ops[-1][1].startswith("triton:")):
                return func(*args, **kwargs)  # ops inside a launch: the launch is the unit
            name = str(func)
            where = w.mods[-1][1] if w.mods else "-"
            _note_alias_writes(loc, name, where, _mutated_args(func, args, kwargs))
            loc.ops_seen += 1
            checked = loc.ops_seen % w.opts.op_stride == 0 and not loc.timed_out()
            if checked:
                loc.checks += 1
                w.check("op-before", f"{name} [in {where}]", level="op")
            w.ops.append((next(frame_ids), name))
            try:
                return func(*args, **kwargs)
            finally:
                if checked and not loc.done:
                    loc.checks += 1
                    w.check("op-after", f"{name} [in {where}]", level="op")
                w.ops.pop()

    mode = OpWatch()
    with mode:
        yield


def _note_alias_writes(loc: Localization, op: str, where: str, tensors) -> None:
    w = loc.w
    for t in tensors:
        hit = _overlaps(w, t)
        if hit is None:
            continue
        role = w.roles.get(hit)
        allowed = startup.ALLOWED_WRITERS.get(role, ())
        if any(q in allowed for _, q in w.stack):
            continue
        own = t is (w.canaries.get(hit) if hit in w.canaries else startup.resolve_path(w.state, hit))
        loc.alias_writes.append({
            "op": op, "tensor": hit, "alias": not own, "module": where,
            "phase": startup.classify(stack_names(w.stack), kv_ready=w.kv_ready, step=w.step),
            "ptr": hex(t.data_ptr()), "t": round(time.perf_counter() - w.t0, 4)})


@contextlib.contextmanager
def _launch_hooks(loc: Localization):
    """Triton launches (compiled: ``JITFunction.run``; CPU: the interpreter's)."""
    w = loc.w
    ps = PatchSet("watch:launches", "watch")
    for klass in _launcher_classes():
        def make(orig):
            def run(self, *a, **k):
                if w.busy or loc.done or w.state is None or not loc.op_wanted():
                    return orig(self, *a, **k)
                name = getattr(getattr(self, "fn", None), "__name__", None) or \
                    getattr(self, "__name__", "?")
                where = w.mods[-1][1] if w.mods else "-"
                hits = sorted({h for v in list(a) + list(k.values())
                               if hasattr(v, "data_ptr") for h in [_overlaps(w, v)] if h})
                if hits and not any(q.startswith("ThinkingBudgetState.") for _, q in w.stack):
                    loc.launches.append({"kernel": name, "module": where, "tensors": hits,
                                         "phase": startup.classify(stack_names(w.stack),
                                                                   kv_ready=w.kv_ready,
                                                                   step=w.step)})
                label = f"triton:{name} [in {where}]"
                loc.checks += 2
                w.check("launch-before", label, level="op")
                w.ops.append((next(frame_ids), f"triton:{name}"))
                try:
                    return orig(self, *a, **k)
                finally:
                    w.check("launch-after", label, level="op")
                    w.ops.pop()
            return run
        ps.wrap(klass, "run", make)
    with ps:
        yield


def _launcher_classes() -> list:
    out = []
    with contextlib.suppress(Exception):
        from triton.runtime.jit import JITFunction

        out.append(JITFunction)
    with contextlib.suppress(Exception):
        from triton.runtime.interpreter import InterpretedFunction

        out.append(InterpretedFunction)
    return out
