"""The start-up watch's options and this process's registry of watches.

``Options`` (what a watch does: localization level, canaries, timeline and ring sizes, the
sanitizer stage), ``WatchError`` (what it cannot do, named), the evidence schema and the canary
pattern, and the registry in which the phase wrappers (``workbook.hooks.watch``) find their watch:
``PENDING`` (installed, waiting for the next runner), ``BY_OBJ`` (bound by object id),
``ACTIVE`` (whose wrapped methods are running, innermost last), ``LOCK``; ``ON_RING``: what to
call once a watch is past its detailed steps (the installer's slimming, registered by
``workbook.hooks.watch``: the Watch never imports its installer).

Deliberately not here: the Watch object itself (``workbook.hooks.watch.core``) and anything that
patches vLLM (``workbook.hooks.watch``).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable

from workbook.core.config import LOCALIZE
from workbook.hooks.watch import protect

SCHEMA = "workbook.watch/1"
CANARY = 0x5AFEC0DE  # int32 pattern of the canary tensors
STEP_BOUNDARIES = {  # kept after the detailed steps (ring mode): they bracket the writers
    ("enter", "ThinkingBudgetState.apply_staged_writes"),
    ("exit", "ThinkingBudgetState.apply_staged_writes"),
    ("enter", "ThinkingBudgetState.apply"), ("exit", "ThinkingBudgetState.apply")}


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
    protect: str = "none"  # none | auto | nvtx | page: the state read-only (workbook.hooks.watch.protect)

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


ON_RING: list[Callable[[], None]] = []  # called when a watch enters ring mode


# ---- the watches of this process and how a wrapper finds its own ------------------------------

PENDING: list[Any] = []  # installed, waiting for the next runner
BY_OBJ: dict[int, Any] = {}  # id(runner / worker / state / speculator) -> watch
ACTIVE: list[Any] = []  # watches whose wrapped methods are running (innermost last)
LOCK = threading.RLock()


def watch_for(obj) -> Any:
    w = BY_OBJ.get(id(obj))
    if w is not None:
        return w
    mr = getattr(obj, "model_runner", None)  # a worker
    if mr is not None:
        return BY_OBJ.get(id(mr))
    return None


def current() -> Any:
    return ACTIVE[-1] if ACTIVE else None


def canary_i32() -> int:
    import numpy as np

    return int(np.array([CANARY], dtype=np.uint32).view(np.int32)[0])
