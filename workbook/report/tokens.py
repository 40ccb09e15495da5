"""Token ids → readable text for tables, grids and plots (report and notebooks).

``decoder(model=..., tokenizer=...)`` returns ``decode(id) -> str``: from a live tokenizer (a
notebook's engine), else from the model folder's ``tokenizer.json`` (a tiny model of
``workbook.core.models`` is rebuilt offline; a checkpoint folder is read as is), else the id
itself. ``show(text)`` makes whitespace and long special tokens visible in a narrow cell.
Decoders are cached per model; a failure to load one never fails a report.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Callable

Decode = Callable[[object], str]
_RESERVED = re.compile(r"^<\|reserved_(\d+)\|>$")


def _id(tok) -> int | None:
    try:
        if tok is None or tok != tok:  # None / NaN
            return None
        return int(tok)
    except (TypeError, ValueError):
        return None


def _wrap(fn: Callable[[int], str]) -> Decode:
    def decode(tok) -> str:
        i = _id(tok)
        if i is None:
            return ""
        try:
            return fn(i)
        except Exception:
            return str(i)
    return decode


@lru_cache(maxsize=16)
def _from_model(model: str) -> Decode | None:
    from workbook.core import models

    try:
        path = models.build(model) if models.is_builtin(model) else model
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tj)
    except Exception:
        return None
    return _wrap(lambda i: tok.decode([i], skip_special_tokens=False))


def decoder(model: str | None = None, tokenizer=None) -> Decode:
    """``decode(id) -> text``; the id as text when no tokenizer can be found."""
    if tokenizer is not None:
        return _wrap(lambda i: tokenizer.decode([i], skip_special_tokens=False))
    if model:
        found = _from_model(str(model))
        if found is not None:
            return found
    return _wrap(str)


def show(text: str, limit: int = 12) -> str:
    """Visible whitespace (⏎ ␣ ⇥), ``<|reserved_N|>`` as ``‹rN›``, cut to ``limit``."""
    m = _RESERVED.match(text or "")
    if m:
        text = f"‹r{m.group(1)}›"
    text = (text or "").replace("\n", "⏎").replace("\t", "⇥")
    if text.strip() == "" and text:
        text = text.replace(" ", "␣")
    elif text.startswith(" "):
        text = "␣" + text[1:]
    return text if len(text) <= limit else text[:limit - 1] + "…"


def label(decode: Decode, tok) -> str:
    """``'text' (id)`` for prose and tables; ``—`` for no token."""
    i = _id(tok)
    if i is None:
        return "—"
    return f"{show(decode(i), 24)!s} ({i})"
