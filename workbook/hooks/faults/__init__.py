"""Faults for healthy vLLM: removable defects that the diagnosis must find and name.

- ``budget``       one fault per entry of the hypothesis catalogue (``workbook.core.hypotheses``)
- ``constraints``  one raw fault per contract (``workbook.core.constraint_fault_catalogue``)

The lowest room of ``workbook.hooks``. May import: core and vllm only; the watch's test writers
and the served row check build on it.
"""
