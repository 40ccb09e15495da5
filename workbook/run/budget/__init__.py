"""The budget study: why vLLM ignores ``thinking_token_budget`` (vLLM #54906).

What a budget run decides, from the pipeline's trace (``workbook.run.pipeline``, which calls
this study through ``STUDIES["budget"]``): was the budget honoured at every row, where is the
first violating step and row, and which MRV2 stage lost the forcing.

- ``diagnose``       the verdict: both sides of the contract, the first violation, the causes
- ``stages``         the cause chain, one rule per MRV2 stage (registration … commit)
- ``evidence_text``  the sentences the stage rules print, from the evidence they cite
- ``probes``         re-runs with one switch that separate the remaining causes
- ``experiments``    notebook 03's A/B variants and notebook 04's guard experiments

Entry points: ``workbook run <hw>`` (through the pipeline), notebooks 01–04.
May import: the spine (``pipeline``, ``request``, ``verdicts``), ``workbook.hooks``, core, vllm.
"""

from __future__ import annotations


def verdict(frames, effective, outcomes=None, cfg=None) -> dict:
    """The budget's verdict of one run (``diagnose.diagnose``)."""
    from workbook.run.budget import diagnose as d

    return d.diagnose(frames, effective, outcomes, cfg)


def with_probes(verdict: dict, probes: dict) -> dict:
    """The verdict with the probes' results fed back (``diagnose.with_probes``)."""
    from workbook.run.budget import diagnose as d

    return d.with_probes(verdict, probes)


def probe_plan(verdict: dict, cfg) -> list[str]:
    """The probes a violated verdict calls for (``probes.plan``)."""
    from workbook.run.budget import probes

    return probes.plan(verdict, cfg)


def run_probes(engine, cfg, verdict: dict) -> dict:
    """Run the planned probes on the in-process engine (``probes.run``)."""
    from workbook.run.budget import probes

    return probes.run(engine, cfg, verdict)


def __getattr__(name: str):
    if name == "PROBES":  # the probe catalogue, without importing it with the package
        from workbook.run.budget.probes import PROBES

        return PROBES
    raise AttributeError(name)
