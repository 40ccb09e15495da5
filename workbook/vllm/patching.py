"""Removable, stackable method patches on vLLM classes.

Every workbook hook (tracer, fault, guard) is a ``PatchSet``: a named group of wrappers, each
``make(original) -> replacement`` for one ``(class, attribute)``. Several patch sets may wrap the
same method; they compose in a fixed order of *layers*, innermost first:

    vLLM's original  <  "fault" (simulates a broken vLLM)  <  "guard" (the fix)  <  "trace"
                     <  "watch" (the start-up watch: phase boundaries around everything)

so the tracer always observes what the guard finally emits, and the guard always sees what a
(simulated) broken vLLM produced. Installing or removing any set recomposes the chain; when the
last wrapper of a method goes, the class gets back the *identical* original object (or loses
the attribute again if it was inherited), so removal restores vLLM exactly.

Not here: what the wrappers do. Not thread-safe by design (vLLM's engine loop is one thread).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

LAYERS = {"fault": 0, "guard": 1, "trace": 2, "watch": 3}
_MISSING = object()
_seq = itertools.count()


@dataclass
class _Chain:
    original: Any  # the object in cls.__dict__ before any patch, or _MISSING if inherited
    wrappers: list = field(default_factory=list)  # (layer, seq, owner, make)
    composed: dict = field(default_factory=dict)  # wrapper set -> its composed function


_chains: dict[tuple[type, str], _Chain] = {}


def _compose(cls: type, attr: str) -> None:
    chain = _chains[(cls, attr)]
    if not chain.wrappers:
        if chain.original is _MISSING:
            if attr in cls.__dict__:
                delattr(cls, attr)
        else:
            setattr(cls, attr, chain.original)
        del _chains[(cls, attr)]
        return
    base = chain.original if chain.original is not _MISSING else _inherited_or_none(cls, attr)
    ordered = sorted(chain.wrappers, key=lambda w: (w[0], w[1]))
    key = tuple((w[1], id(w[2])) for w in ordered)
    if key not in chain.composed:  # the same set of wrappers gives back the same object, so
        fn = base                  # removing one layer restores the method of the others exactly
        for _layer, _s, _owner, make in ordered:
            fn = make(fn)
        chain.composed[key] = fn
    live = set(key)  # forget compositions with a removed wrapper (they hold it and its data)
    for k in [k for k in chain.composed if not live.issuperset(k)]:
        del chain.composed[k]
    setattr(cls, attr, chain.composed[key])


def _inherited(cls: type, attr: str):
    for klass in getattr(cls, "__mro__", ())[1:]:
        if attr in klass.__dict__:
            return klass.__dict__[attr]
    raise AttributeError(f"{cls.__qualname__}.{attr} does not exist")


def _inherited_or_none(cls: type, attr: str):
    try:
        return _inherited(cls, attr)
    except (AttributeError, TypeError):
        return None


def original(cls: type, attr: str):
    """The unpatched attribute (what vLLM defines), whether or not patches are installed."""
    chain = _chains.get((cls, attr))
    if chain is None:
        return cls.__dict__.get(attr, _MISSING) if attr in cls.__dict__ else _inherited(cls, attr)
    return chain.original if chain.original is not _MISSING else _inherited(cls, attr)


class PatchSet:
    """A named group of wrappers installed and removed together (a context manager too)."""

    def __init__(self, name: str, layer: str):
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {sorted(LAYERS)}")
        self.name = name
        self.layer = LAYERS[layer]
        self._specs: list[tuple[type, str, Callable]] = []
        self._on_remove: list[Callable[[], None]] = []
        self.installed = False

    def on_remove(self, fn: Callable[[], None]) -> "PatchSet":
        """Run ``fn()`` after the wrappers are gone (to undo state a wrapper left behind)."""
        self._on_remove.append(fn)
        return self

    def wrap(self, cls: type, attr: str, make: Callable[[Callable], Callable], *,
             allow_new: bool = False) -> "PatchSet":
        """Register ``make(original) -> replacement`` for ``cls.attr`` (applied on install).

        ``allow_new``: the attribute may be absent (``make`` then gets ``None``); removal deletes
        it again.
        """
        if not allow_new and not hasattr(cls, attr):
            raise AttributeError(f"{cls.__module__}.{cls.__qualname__}.{attr} does not exist")
        self._specs.append((cls, attr, make))
        if self.installed:
            self._add(cls, attr, make)
        return self

    def _add(self, cls, attr, make):
        key = (cls, attr)
        if key not in _chains:
            _chains[key] = _Chain(cls.__dict__[attr] if attr in cls.__dict__ else _MISSING)
        _chains[key].wrappers.append((self.layer, next(_seq), self, make))
        _compose(cls, attr)

    def install(self) -> "PatchSet":
        if not self.installed:
            self.installed = True
            for cls, attr, make in self._specs:
                self._add(cls, attr, make)
        return self

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        for cls, attr, _make in self._specs:
            chain = _chains.get((cls, attr))
            if chain is None:
                continue
            chain.wrappers = [w for w in chain.wrappers if w[2] is not self]
            _compose(cls, attr)
        for fn in self._on_remove:
            fn()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.remove()
        return False


def active() -> dict[str, list[str]]:
    """``{"Class.attr": [patch set names, innermost first]}`` for what is installed now."""
    return {f"{getattr(cls, '__qualname__', cls.__name__)}.{attr}": [w[2].name for w in sorted(c.wrappers,
                                                                       key=lambda w: (w[0], w[1]))]
            for (cls, attr), c in _chains.items()}


class Hooked:
    """A recorder built on one ``PatchSet`` (``self.patches``): ``install()`` returns the
    recorder, ``remove()`` takes its layer out again, and ``with recorder:`` does both."""

    patches: PatchSet

    def install(self):
        self.patches.install()
        return self

    def remove(self) -> None:
        self.patches.remove()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.remove()
        return False
