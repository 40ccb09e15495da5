"""Observing MRV2: one observer per run, one wrapper per hook point, calling each collector.

- ``observer``       the patch set and its collectors
- ``outputs``        the step's sampled / accepted / emitted tokens and logprobs, recorded once
- ``tracer``         per-step evidence (path, drafts, budget state, logits rows, tokens), with
  ``budget_trace`` (its thinking-budget part), ``trace_records`` and ``trace_tables``
- ``rowcheck``       every logits row, raw and processed, at the contract columns
- ``served_rows``    the row check inside a served engine (driven by files)
- ``preempt``        vLLM's own preemption count per request (the preemption axis)
- ``steer``          the drafter's proposals replaced per request (the drafter axis)

Observing never changes what vLLM samples (``steer`` changes drafts only, and only when asked).
May import: core, vllm, and ``workbook.hooks.faults`` (``served_rows`` installs a batch's
constraint fault from its control file).
"""
