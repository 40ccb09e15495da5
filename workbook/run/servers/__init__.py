"""The server study: does a running ``vllm serve`` honour what it was asked?

- ``check``        ``workbook check-server``: the budget from the OpenAI endpoint, judged per
  position; markers given that are not the server's are a wrong setting (exit 2)
- ``constraints``  ``check-server --constraints``: every constraint case through
  ``/v1/completions``, judged host-side
- ``requests``     its requests and what they return (prompts, control rows, grammar evidence)
- ``serve``        ``workbook serve``: an environment run's model behind ``vllm serve``

Entry points: ``workbook check-server``, ``workbook serve``. May import: the spine
(``server``, ``serverapi``, ``verdicts``), core, vllm, and the constraints study it builds on
(``workbook.run.constraints.cases``: the cases it sends). The grid over a server is the
constraints study's (``workbook.run.constraints.served``).
"""
