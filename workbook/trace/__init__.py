"""Tracing of MRV2 sampling internals (``Tracer``) and the trace tables (``store``)."""

from workbook.trace.store import load  # noqa: F401
from workbook.trace.tracer import Tracer  # noqa: F401
