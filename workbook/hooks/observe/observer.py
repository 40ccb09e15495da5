"""One observer per MRV2 step: every collector of evidence on the same hook points.

``Observer(collectors).install()`` installs ONE ``workbook.vllm.patching.PatchSet`` (layer
"trace") with ONE wrapper per hook point (``workbook.vllm.hookpoints``); that wrapper calls each
installed collector's ``Tap`` there, in the collectors' order: every ``before(*args)`` (its
return value is that tap's state for this call), then vLLM's method, then every ``final(state)``
(also when vLLM raises: a step's bookkeeping ends), then every ``after(state, out, *args)``.
A collector's error in a tap goes to its own ``error(where, e)``: evidence lost is never a
reason to break the engine. A tap with ``make`` instead is a whole wrapper (a hook point only one
collector needs, such as the thinking budget's kernel launches); it composes inside the shared
one. Collectors: ``workbook.hooks.observe.outputs.Outputs`` (the step's sampled / accepted / emitted
tokens and logprobs, recorded once), ``workbook.hooks.observe.tracer.Tracer`` (the step and the thinking
budget's evidence, ``budget_trace``) and ``workbook.hooks.observe.rowcheck.RowCheck`` (every logits row
and the prompt rows); the last two NEED ``Outputs`` (``Collector.needs``): the observer adds one
where none is given and puts every needed collector first, so its taps run before its readers';
``attached(observer)`` lets a reader find it and ask for what it reads.
``workbook.hooks.install`` builds one observer from a run's configuration.

A collector used alone (``with Tracer() as t:``) gets an observer of its own. Deliberately not
here: what a collector records (its module) or judges (``workbook.run``). Removing the observer
restores vLLM's methods exactly (``patching``); collectors never write into vLLM tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from workbook.vllm import patching


@dataclass(frozen=True)
class Tap:
    """What one collector does at one hook point (``cls.attr``)."""
    cls: type
    attr: str
    before: Callable[..., Any] | None = None  # before(*args, **kw) -> state
    final: Callable[[Any], None] | None = None  # final(state): after vLLM's method, even if it raised
    after: Callable[..., None] | None = None  # after(state, out, *args, **kw)
    make: Callable[[Callable], Callable] | None = None  # a whole wrapper (one collector's point)


class Collector(patching.Hooked):
    """A source of evidence on the observer's hook points: ``taps()`` lists its ``Tap``s,
    ``error(where, e)`` keeps what went wrong, ``removed()`` runs after the hooks are gone.
    ``install()`` / ``remove()`` / ``with``: through its observer (its own when used alone)."""

    name = "collector"
    needs: tuple = ()  # collector types this one reads (the observer adds them, first)
    _observer: "Observer | None" = None

    def attached(self, observer: "Observer") -> None:
        """Called once every collector of ``observer`` is there, before the taps are read."""

    def taps(self) -> list[Tap]:
        raise NotImplementedError

    def error(self, where: str, e: Exception) -> None:
        raise NotImplementedError

    def removed(self) -> None:
        """After the observer's patches are gone (a flush, say)."""

    @property
    def observer(self) -> "Observer":
        if self._observer is None:
            Observer([self])
        return self._observer

    @property
    def patches(self) -> patching.PatchSet:
        return self.observer.patches

    def remove(self) -> None:
        self.observer.remove()


class Observer(patching.Hooked):
    """The collectors of one run on one patch set; ``collector(cls)`` finds one by type."""

    def __init__(self, collectors: list[Collector]):
        collectors = list(collectors)
        for c in list(collectors):
            for kind in c.needs:
                if not any(isinstance(o, kind) for o in collectors):
                    collectors.insert(0, kind())
        needed = tuple(k for c in collectors for k in c.needs)
        self.collectors = ([c for c in collectors if isinstance(c, needed)] +
                           [c for c in collectors if not isinstance(c, needed)])
        for c in self.collectors:
            if c._observer is not None:
                raise ValueError(f"{c.name} is already observed")
            c._observer = self
        for c in self.collectors:
            c.attached(self)
        self.patches = patching.PatchSet(
            "observe:" + "+".join(c.name for c in self.collectors), "trace")
        points: dict[tuple[type, str], list[tuple[Collector, Tap]]] = {}
        for c in self.collectors:
            for t in c.taps():
                points.setdefault((t.cls, t.attr), []).append((c, t))
        for (cls, attr), taps in points.items():
            self.patches.wrap(cls, attr, _wrapper(f"{cls.__name__}.{attr}", taps))
        for c in self.collectors:
            self.patches.on_remove(c.removed)

    def collector(self, kind: type) -> Any:
        return next((c for c in self.collectors if isinstance(c, kind)), None)


def _wrapper(where: str, taps: list[tuple[Collector, Tap]]):
    arounds = [t.make for _c, t in taps if t.make is not None]
    hooks = [(c, t) for c, t in taps if t.make is None]
    befores = [(i, c, t.before) for i, (c, t) in enumerate(hooks) if t.before is not None]
    finals = [(i, c, t.final) for i, (c, t) in enumerate(hooks) if t.final is not None]
    afters = [(i, c, t.after) for i, (c, t) in enumerate(hooks) if t.after is not None]
    n = len(hooks)

    def make(orig):
        inner = orig
        for m in arounds:
            inner = m(inner)
        if not hooks:
            return inner

        def observed(*a, **k):
            states = [None] * n
            for i, c, fn in befores:
                try:
                    states[i] = fn(*a, **k)
                except Exception as e:  # a collector must never break the engine
                    c.error(where, e)
            try:
                out = inner(*a, **k)
            finally:
                for i, c, fn in finals:
                    try:
                        fn(states[i])
                    except Exception as e:
                        c.error(where, e)
            for i, c, fn in afters:
                try:
                    fn(states[i], out, *a, **k)
                except Exception as e:
                    c.error(where, e)
            return out

        return observed

    return make
