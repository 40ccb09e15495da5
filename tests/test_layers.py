"""The package's layers import one way: core ← vllm ← hooks ← run ← batch ← report ← cli.
A module imports only from its own layer or the ones before it (function-level imports too)."""

from __future__ import annotations

import ast
import os

LAYERS = ("core", "vllm", "hooks", "run", "batch", "report", "cli")
PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workbook")


def _layer_of(path: str) -> str | None:
    first = os.path.relpath(path, PKG).split(os.sep)[0].removesuffix(".py")
    return first if first in LAYERS else None


def _imported_layers(tree: ast.AST, own: str):
    for n in ast.walk(tree):
        names: list[str] = []
        if isinstance(n, ast.ImportFrom):
            if n.level == 2 and n.module:  # from ..x import y
                names = [n.module.split(".")[0]]
            elif n.level == 0 and n.module and n.module.startswith("workbook."):
                names = [n.module.split(".")[1]]
            elif n.level == 0 and n.module == "workbook":
                names = [a.name for a in n.names]
        elif isinstance(n, ast.Import):
            names = [a.name.split(".")[1] for a in n.names if a.name.startswith("workbook.")]
        for m in names:
            if m in LAYERS and m != own:
                yield n.lineno, m


def test_imports_point_one_way():
    upward = []
    for root, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(root, f)
            own = _layer_of(path)
            if not f.endswith(".py") or own is None:
                continue
            with open(path) as fh:
                tree = ast.parse(fh.read())
            for line, m in _imported_layers(tree, own):
                if LAYERS.index(m) > LAYERS.index(own):
                    upward.append(f"{os.path.relpath(path, PKG)}:{line} imports workbook.{m}")
    assert upward == []
