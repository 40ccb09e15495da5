"""The rules of the investigation, with no vLLM or torch imports: the run configuration and its
validation (``config``), the budget rule (``budget``), the hypothesis catalogue
(``hypotheses``), the tiny offline models (``models``), the trace schema (``tracefiles``) and
the run-folder schema (``rundir``)."""
