"""The profiling run's dummy sampler as vLLM PR #57926 will have it: with sampling parameters.

vLLM ≤ 0.34's ``GPUModelRunner._dummy_sampler_run`` builds its batch with
``InputBatch.make_dummy``, which registers no sampling parameters, so
``Sampler.apply_sampling_params`` exits early during profiling and the thinking-budget state's
``apply`` (and every other logits processor) never runs there. Open PR #57926 registers
``SamplingParams.for_sampler_warmup()`` for each dummy row and calls ``apply_staged_writes()``
before the dummy sampler — it changes the very window in which the reporter's markers died.

``sampler_warmup()`` returns a ``PatchSet`` doing the same on today's vLLM (``RunConfig.
sampler_warmup``; installed before the engine starts by ``workbook.hooks.pre_start``, removed
once it is up): before the original ``_dummy_sampler_run``, rows ``0..n-1`` (the dummy batch's
``idx_mapping`` is ``arange(n)``) get ``sampler.add_request(i, params)`` and the sampler's
``apply_staged_writes()`` runs. On CPU top-k / top-p are left out: vLLM's Triton top-k/top-p
kernel does not run in Triton's interpreter (``RECORD["dropped"]`` says so). Where vLLM lacks ``for_sampler_warmup`` (0.28/0.29) the same
parameters are built here (fields the version does not know are left out). The slots stay
registered, as in the PR; the first real requests overwrite them.

Not here: what the watch makes of that window (``workbook.hooks.watch``). Removing the patch
restores vLLM exactly.
"""

from __future__ import annotations

import functools

from workbook.vllm.patching import PatchSet

RECORD: dict = {"calls": 0, "rows": 0, "params": None}  # what the patch did in this process


CPU_DROPPED = ("top_k", "top_p")  # vLLM's Triton top-k/top-p kernel fails in Triton's
# interpreter (``tl.range`` yields Python ints: "'int' object has no attribute 'to'")


def warmup_params(cpu: bool = False):
    """``SamplingParams.for_sampler_warmup()`` or its equivalent on versions without it; on
    CPU without top-k / top-p (``CPU_DROPPED``: the interpreter cannot run that kernel)."""
    from vllm import SamplingParams

    if hasattr(SamplingParams, "for_sampler_warmup"):
        p = SamplingParams.for_sampler_warmup()
        if cpu:
            p = SamplingParams(**{**{f: getattr(p, f) for f in (
                "temperature", "min_p", "frequency_penalty", "presence_penalty",
                "repetition_penalty", "min_tokens", "logit_bias", "logprobs",
                "prompt_logprobs")}})
        return p
    want = dict(temperature=0.9, top_p=0.9, top_k=50, min_p=0.1, frequency_penalty=0.5,
                presence_penalty=0.5, repetition_penalty=1.2, min_tokens=2,
                logit_bias={0: -1.0, 1: 0.5}, logprobs=5, prompt_logprobs=1)
    for k in CPU_DROPPED if cpu else ():
        del want[k]
    return SamplingParams(**want)


def _make(orig):
    @functools.wraps(orig)
    def _dummy_sampler_run(self, hidden_states, *a, **k):
        sampler = getattr(self, "sampler", None)
        if sampler is not None and hasattr(sampler, "add_request"):
            import torch

            cpu = hidden_states.device.type == "cpu"
            params = warmup_params(cpu=cpu)
            n = int(hidden_states.shape[0])
            with torch.inference_mode():
                for i in range(n):
                    sampler.add_request(i, params)
                sampler.apply_staged_writes()
            RECORD.update(calls=RECORD["calls"] + 1, rows=n, params=repr(params)[:300],
                          dropped=list(CPU_DROPPED) if cpu else [])
        return orig(self, hidden_states, *a, **k)
    return _dummy_sampler_run


def sampler_warmup() -> PatchSet:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if "_dummy_sampler_run" not in GPUModelRunner.__dict__:
        raise RuntimeError("sampler_warmup: this vLLM's MRV2 GPUModelRunner has no "
                           "_dummy_sampler_run (the hook point of PR #57926's window)")
    return PatchSet("sampler-warmup", "fault").wrap(GPUModelRunner, "_dummy_sampler_run", _make)
