"""Red zones around the budget state's markers: read-only guard bytes before and after each.

With the markers alone read-only (``workbook.hooks.watch.protect``, form ``nvtx``), a kernel that
starts in a neighbouring buffer and runs into a marker faults only on the marker's own bytes:
memcheck reports "4 bytes inside", and nothing says the write came from elsewhere. Here each
marker is moved into a padded buffer of its own, ``[red zone below | marker | red zone above]``,
so that the padded buffer is the region the permission covers: a write running in from a
neighbour faults in the red zone first, and every faulting access is reported with its
address. ``workbook.run.writer.overrun`` reads the range those accesses cover.

What vLLM computes is unchanged: the marker keeps its dtype, shape and values (copied), only
its address moves (the state's attribute is re-pointed right after ``ThinkingBudgetState.
__init__``, before anything reads it, as the CPU twin moves it onto its own page); the red zone
bytes belong to no tensor vLLM uses. Layouts:

- caching allocator off: the padded buffer is its own ``cudaMalloc`` (its size as asked);
- caching allocator on: it is one block of a segment (rounded up by the allocator: the block's
  size from ``torch.cuda.memory_snapshot()``); the segment is registered as an NVTX heap with
  every block a region (``protect.NvtxGuard``), and the padded block is the marker's region.

Size: ``WORKBOOK_REDZONE`` bytes on each side (default 4096; 0: no red zones; a multiple of 16,
so that the marker keeps its pointer's alignment class and the kernels reading it compile to the
same specializations). Why 4 KiB: memcheck stops a kernel at its first faulting accesses (one
program's worth were reported on the H100 — 64 stores of a run from 600 bytes below — then the
launch failed), so only the lowest read-only memory a long run hits is ever reported; with 256
bytes that was the canary below the marker's block, and the marker went unnamed. A red zone
wider than the distance a run starts below (or ends above) the marker makes that first faulting
memory the marker's own red zone; three markers cost 24 KiB of device memory. Only the markers get red zones: the marker caches are lifted around the
state's own writers and a permission covers a whole region.
"""

from __future__ import annotations

import os

from workbook.hooks.watch import layout as alloc_layout

ENV = "WORKBOOK_REDZONE"
DEFAULT = 4096
MAX = 1 << 20


class RedZoneError(ValueError):
    """A red-zone size that cannot be used (named in the message)."""


def size_from_env(env: dict | None = None) -> int:
    """The red zone's size in bytes from ``WORKBOOK_REDZONE`` (default ``DEFAULT``, 0: off)."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return DEFAULT
    try:
        n = int(raw, 0)
    except ValueError:
        raise RedZoneError(f"{ENV}={raw!r}: a number of bytes (0: no red zones)") from None
    if n < 0 or n > MAX or n % 16:
        raise RedZoneError(f"{ENV}={raw!r}: a multiple of 16 between 0 and {MAX} bytes")
    return n


def _block_size(ptr: int) -> int | None:
    """The caching allocator's block holding ``ptr`` (None: not in a segment, e.g. caching off
    or CPU)."""
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        return None
    seg = alloc_layout.segment_of(ptr, alloc_layout.segments())
    if seg is None:
        return None
    return next((b["size"] for b in alloc_layout.blocks(seg)
                 if b["address"] <= ptr < b["address"] + b["size"]), None)


class RedZones:
    """The markers of one state moved into padded buffers (``pad``); ``layout()`` is the
    evidence the sanitizer stage ties memcheck's addresses to."""

    def __init__(self, state, size: int, names=None):
        from workbook.hooks.watch import protect

        self.state = state
        self.size = size
        self.names = tuple(names or protect.MARKERS)
        self.zones: dict[str, dict] = {}
        self.notes: list[str] = []

    def pad(self) -> "RedZones":
        import torch

        for name in self.names:
            t = getattr(self.state, name, None)
            if t is None or not hasattr(t, "data_ptr") or not t.numel():
                self.notes.append(f"{name}: absent or empty, no red zone")
                continue
            if not t.is_contiguous():
                self.notes.append(f"{name}: not contiguous, no red zone")
                continue
            nbytes = t.numel() * t.element_size()
            r = self.size
            ctx = torch.inference_mode() if t.is_inference() else torch.inference_mode(False)
            with ctx:
                buf = torch.zeros(r + nbytes + r, dtype=torch.uint8, device=t.device)
                new = buf[r:r + nbytes].view(t.dtype).view(t.shape)
                new.copy_(t)
            setattr(self.state, name, new)
            base = buf.data_ptr()
            region = _block_size(base) or (r + nbytes + r)
            p = new.data_ptr()
            self.zones[name] = {"tensor": name, "buf": buf, "base": base, "size": region,
                                "ptr": p, "nbytes": nbytes, "below": [base, p],
                                "above": [p + nbytes, base + region],
                                "asked": r + nbytes + r}
        return self

    def bases(self) -> dict[str, int]:
        """``{marker: the padded buffer's address}`` (the region a permission is assigned on)."""
        return {n: z["base"] for n, z in self.zones.items()}

    def layout(self) -> dict[str, dict]:
        """``{marker: {base, size, below, above (byte ranges [lo, hi)), *_hex}}``."""
        return {n: {"base": z["base"], "base_hex": hex(z["base"]), "size": z["size"],
                    "asked": z["asked"], "below": z["below"], "above": z["above"],
                    "below_bytes": z["below"][1] - z["below"][0],
                    "above_bytes": z["above"][1] - z["above"][0]}
                for n, z in self.zones.items()}

    def to_dict(self) -> dict:
        return {"size": self.size, "markers": list(self.zones), "notes": list(self.notes),
                "zones": self.layout()}


def pad(state, size: int | None = None) -> RedZones | None:
    """Move ``state``'s markers into padded buffers (``size`` bytes each side; None: from the
    environment). None when the size is 0."""
    size = size_from_env() if size is None else size
    if not size:
        return None
    return RedZones(state, size).pad()
