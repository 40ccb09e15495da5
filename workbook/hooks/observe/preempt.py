"""vLLM's own preemption counter per request (the ``preemption`` axis of the constraints grid).

A KV cache a few blocks small (``RunConfig.kv_blocks`` = vLLM's ``num_gpu_blocks_override``)
should make the scheduler preempt running requests and resume them later (recompute). Whether
it did is vLLM's to say: its scheduler counts ``Request.num_preemptions`` (incremented in
``Scheduler._preempt_request``). This hook wraps ``Scheduler._free_request`` (every finished or
aborted request passes through it) and keeps, per prompt (the key the row check matches
requests by), the request's ``num_preemptions`` when it is freed. ``counts`` maps prompt tuple
-> preemptions; ``available`` is False when this vLLM's ``Request`` has no such counter (then a
cell says preemption could not be verified, never that it happened).
"""

from __future__ import annotations

from workbook.vllm import patching


class PreemptionCount:
    def __init__(self):
        self.counts: dict[tuple, int] = {}
        self.available = True
        self.ps: patching.PatchSet | None = None

    def install(self) -> "PreemptionCount":
        from vllm.v1.core.sched.scheduler import Scheduler

        ps = patching.PatchSet("preempt-count", "trace")
        ps.wrap(Scheduler, "_free_request", self._w_free)
        self.ps = ps.install()
        return self

    def remove(self) -> None:
        if self.ps is not None:
            self.ps.remove()
            self.ps = None

    def _w_free(self, original):
        pc = self

        def _free_request(sched, request, *a, **kw):
            n = getattr(request, "num_preemptions", None)
            if n is None:
                pc.available = False
            else:
                prompt = tuple(int(t) for t in (getattr(request, "prompt_token_ids", None)
                                                or ()))
                pc.counts[prompt] = pc.counts.get(prompt, 0) + int(n)
            return original(sched, request, *a, **kw)

        return _free_request

    def of(self, prompt) -> int | None:
        """Preemptions of the request with ``prompt`` (None: no counter in this vLLM)."""
        if not self.available:
            return None
        return self.counts.get(tuple(int(t) for t in prompt), 0)
