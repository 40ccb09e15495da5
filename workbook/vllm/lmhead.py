"""Edits of a runner's ``lm_head`` (the target's and a drafter's own): zeroed, scaled, restored.

The tests, the constraints grid and check B shape the target distribution by editing the
``lm_head`` weights in place (zeroed: every logit 0, so token 0 is everyone's argmax and every
draft of a zeroed drafter is kept; scaled: the tiny models' ~1e-5 logits spread to order 1).
One place for that edit, whether the runner is in this process (``run.request``'s context
managers) or inside a served engine's worker (``hooks.served_rows``, driven by its control
file). On the CPU platform vLLM runs linears from a pre-packed copy: every change is re-packed.

Not here: which batch wants which head (``run.constraints`` / ``run.grid``).
"""

from __future__ import annotations

from typing import Callable

EDITS = ("natural", "zero", "scaled")  # "scaled" takes a factor


def lm_heads(runner) -> list:
    """The target's ``lm_head`` and a drafter's own (shared modules once)."""
    heads, seen = [], set()
    for model in (getattr(runner, "model", None), getattr(getattr(runner, "speculator", None),
                                                          "model", None)):
        if model is None:
            continue
        for name, mod in model.named_modules():
            if name.endswith("lm_head") and hasattr(mod, "weight") and id(mod) not in seen:
                seen.add(id(mod))
                heads.append(mod)
    if not heads:
        raise RuntimeError("no lm_head found in the target or draft model")
    return heads


def repack(module) -> None:
    """Re-pack a linear after its weight changed (vLLM's CPU platform only)."""
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return
    import torch

    if module.weight.device.type == "cpu" and not torch.cuda.is_available():
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def edit_fn(edit: str, factor: float | None = None) -> Callable | None:
    """The in-place weight edit named ``edit`` (None for ``natural``)."""
    if edit == "natural":
        return None
    if edit == "zero":
        return lambda w: w.zero_()
    if edit == "scaled":
        if not factor:
            raise ValueError("lm_head edit 'scaled' needs a factor")
        return lambda w: w.mul_(float(factor))
    raise ValueError(f"unknown lm_head edit {edit!r}; known: {', '.join(EDITS)}")


def apply(runner, edit: Callable) -> Callable[[], None]:
    """Apply ``edit(weight)`` in place to the runner's lm_heads (re-packed); returns the
    function that writes the original weights back."""
    import torch

    heads = lm_heads(runner)
    saved = [h.weight.detach().clone() for h in heads]
    with torch.no_grad():
        for h in heads:
            edit(h.weight)
            repack(h)

    def restore() -> None:
        with torch.no_grad():
            for h, w in zip(heads, saved):
                h.weight.copy_(w)
                repack(h)
    return restore
