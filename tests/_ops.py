"""The operators one source file issues, seen at PyTorch's dispatcher (so it holds on CPU)."""

from __future__ import annotations

import os
import sys

from torch.utils._python_dispatch import TorchDispatchMode

# operators that build a tensor from host data or read a device value: each a synchronization
# (or a blocking copy) on a GPU
HOST_OPS = ("aten.lift_fresh.default", "aten._local_scalar_dense.default")


class OpsFrom(TorchDispatchMode):
    """``with OpsFrom("workbook/hooks/observe/tracer.py", ...) as ops:`` → ``ops.seen``: (operator,
    "function:line") for every operator whose nearest non-torch caller is one of those files."""

    def __init__(self, *paths: str):
        super().__init__()
        self.paths = tuple(p.replace("/", os.sep) for p in paths)
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        f = sys._getframe(1)
        while f is not None and f"{os.sep}torch{os.sep}" in f.f_code.co_filename:
            f = f.f_back
        if f is not None and f.f_code.co_filename.endswith(self.paths):
            self.seen.append((str(func), f"{f.f_code.co_name}:{f.f_lineno}"))
        return func(*args, **(kwargs or {}))
