"""A constraint case's ``SamplingParams`` (greedy, ``ignore_eos``, the case's own parameters,
structured outputs as vLLM's ``StructuredOutputsParams``) and whether an exception is vLLM's own
refusal of a request. Shared by the grid's cases (``workbook.run.constraints.cases``, which re-exports
both) and its axes (``workbook.run.constraints.axes``). Deliberately not here: which cases exist or how a
case is judged.
"""

from __future__ import annotations


def sampling_params(kw: dict, max_tokens: int = 16, n: int = 1, temperature: float = 0.0,
                    seed: int | None = None):
    """The case's ``SamplingParams``: greedy; with ``n`` > 1 (the grid's ``n`` axis: vLLM
    refuses n > 1 under greedy sampling) sampled at ``temperature`` with ``seed``."""
    from vllm import SamplingParams

    kw = dict(kw)
    so = kw.pop("structured_outputs", None)
    if so is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = StructuredOutputsParams(**so)
    base = {"temperature": float(temperature), "max_tokens": max_tokens, "ignore_eos": True,
            **({"n": int(n)} if n != 1 else {}),
            **({"seed": int(seed)} if seed is not None and temperature else {})}
    base.update(kw)
    return SamplingParams(**base)


def is_refusal(e: Exception) -> bool:
    """vLLM's own validation: ``VLLMValidationError`` (not a ValueError), ValueError,
    NotImplementedError and pydantic's ValidationError (a ValueError) of its config classes."""
    return type(e).__name__ == "VLLMValidationError" or isinstance(e, (ValueError,
                                                                        NotImplementedError))
