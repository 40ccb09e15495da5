"""A user's own Triton kernel and its wrapper, outside the workbook (the writer the sanitizer
stage must name by this module's frame, not Triton's launcher): ``clear_ids(t)`` zeroes an
int32 tensor through ``_clear_kernel``. Loaded by file path (``workbook.hooks.watch.writers``)."""

import triton
import triton.language as tl


@triton.jit
def _clear_kernel(ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < n)


def clear_ids(t):
    block = max(16, 1 << (t.numel() - 1).bit_length())
    _clear_kernel[(1,)](t, t.numel(), BLOCK=block)


@triton.jit
def _fill_kernel(ptr, start, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + start + offs, tl.full([BLOCK], value, tl.int32), mask=offs < n)


def fill_ids(buf, value=0, start=0, n=None):
    """Fill ``n`` int32 from element ``start`` of ``buf`` with ``value`` (neither checked against
    ``buf``'s bounds: the overrun writer passes a ``start`` below the buffer)."""
    n = buf.numel() - start if n is None else n
    _fill_kernel[(triton.cdiv(n, 128),)](buf, start, n, value, BLOCK=128)
