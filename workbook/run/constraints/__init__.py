"""The constraints study: every per-request sampling constraint under speculative decoding.

Each cell is a constraint × speculative method × batch (× an axis point) on the installed vLLM,
judged at every logits row (draft rows included), on the output, and against the same request
without speculation.

- ``cases``         the cases and the judging: row check, output check, differential
- ``caseparams``    a case's ``SamplingParams`` and whether vLLM refused it
- ``axes``          the grid's axes (async scheduling, arrival, preemption, logprobs mode, drafter,
  reasoning configuration): points, validation, staggered arrival, steer plans
- ``plan``          the grid's plan from ``environments/constraints.yaml`` (+ ``--only``, ``--set``):
  every ``RunConfig``, bad input refused before any engine
- ``grid``          the grid as a study: engines, cells, run folder (``workbook run constraints``)
- ``served``        the same cells over ``vllm serve`` (``--set mode=server``)
- ``rowjudge``      the row check judged: predictions per column, first violation, attribution
- ``distribution``  the oracle under temperature > 0 (``diststats``: its statistics, no engine)

Entry points: ``workbook run constraints``, ``python -m workbook.run.constraints.distribution``,
notebook 06. May import: the spine (``backends``, ``request``, ``verdicts``, ``server``,
``serverapi``), ``workbook.hooks``, core (the contracts: ``workbook.core.contracts``), vllm.
A new constraint lands in ``workbook.core.contracts`` (its class and table tests) and
``workbook.hooks.faults.constraints`` (its catalogue fault); a new axis in ``axes`` and
``environments/constraints.yaml``.
"""
