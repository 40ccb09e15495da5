"""One investigation run, and the studies built on it.

The spine, at this folder's root (every study may import it; it imports no study):

- ``pipeline``   the one pipeline of named steps (validate → start → request → checks → trace →
  watch → diagnose → probes → finish), each writing its evidence file; the study whose
  diagnosis and probes it runs is picked by name (``pipeline.STUDIES``)
- ``backends``   the engine behind a run: in-process or ``vllm serve``, one interface
- ``server``     the ``vllm serve`` process, its request and its traces; ``serverapi`` the
  OpenAI-compatible HTTP transport and wire format (body sent, logprobs read back)
- ``request``    the reported request, its outcome, checks A and B
- ``verdicts``   the one verdict record and the constraint-independent reading of a trace
- ``integrity``  the start-up watch's evidence read into a verdict section

The studies, one folder each (a study imports the spine and lower layers, never another
study, except where its docstring says it builds on one):

- ``budget/``       why vLLM ignores ``thinking_token_budget``: diagnosis, stage rules, probes
- ``constraints/``  every per-request constraint under speculative decoding: the grid, its
  axes, the row judge, the grid over ``vllm serve``, the distribution oracle
- ``servers/``      checking a running ``vllm serve`` (``check-server``, its ``--constraints``,
  ``workbook serve``); builds on ``constraints/`` (it sends the grid's cases)
- ``writer/``       who writes into the budget state: ``workbook watch``, compute-sanitizer,
  overruns, Python frames

Layering (``tests/test_layers_house.py``): core ← vllm ← hooks ← run (spine ← studies) ← batch
← report ← cli.
"""
