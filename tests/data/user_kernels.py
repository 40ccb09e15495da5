"""A user's own Triton kernel and its wrapper, outside the workbook (the writer the sanitizer
stage must name by this module's frame, not Triton's launcher): ``clear_ids(t)`` zeroes an
int32 tensor through ``_clear_kernel``. Loaded by file path (``workbook.hooks.writers``)."""

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
def _fill_kernel(ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.full([BLOCK], value, tl.int32), mask=offs < n)


def fill_ids(buf, value=0):
    """Fill every int32 of ``buf`` with ``value`` (the overrun writer hands it a span that starts
    in a neighbouring buffer and ends on a marker)."""
    n = buf.numel()
    _fill_kernel[(triton.cdiv(n, 128),)](buf, n, value, BLOCK=128)
