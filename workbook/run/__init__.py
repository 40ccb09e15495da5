"""One investigation run: the pipeline (``pipeline``) over a backend (``backends``: in-process
engine or ``vllm serve`` via ``server``), the reported request and checks A/B (``request``),
the diagnosis (``diagnose``, its stage rules in ``stages``) and the experiments of notebooks
03/04 (``experiments``)."""
