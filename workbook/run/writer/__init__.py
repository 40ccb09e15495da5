"""The writer study: who writes into ``ThinkingBudgetState``'s device tensors, and when.

- ``command``    ``workbook watch``: watched start-ups, module then op localization, the passes
- ``stage``      ``watch --sanitize``: the pass under compute-sanitizer (or the CPU page twin)
- ``sanitizer``  memcheck's report (and the CPU twin's fault dump) → the writer
- ``overrun``    a writer's whole access range from memcheck's faulting accesses, vs red zones
- ``frames``     the writer named from a Python stack (the innermost non-machinery frame)

Entry points: ``workbook watch``, notebook 05. May import: the spine (``pipeline``,
``request``, ``server``, ``integrity``), ``workbook.hooks`` (the watch lives in
``workbook.hooks.watch``), core, vllm.
"""
