"""Steer the drafter: replace its proposals per request (``RunConfig.drafter_steer``).

Speculative decoding is lossless: the output must not depend on what the drafter proposes. A
drafter's proposals are therefore free input, and steering them is a legitimate way to make
drafts reach verification and acceptance under every constraint (the tiny models' drafters
rarely propose a token a grammar, ``allowed_token_ids`` or a penalty lets through). This hook
wraps the speculator's ``propose`` (MRV2: ``GPUModelRunner.speculator.propose`` returns the
``[num_reqs, k]`` draft tokens of the step) and overwrites the rows of the requests it was given
a plan for; every other request keeps vLLM's own drafts. A plan is a token list indexed by
output position: the draft proposed for output index ``n`` (``n`` = the request's output
length after this step, read from the runner's ``req_states``: ``total_len - prompt_len``) is
``plan[n]`` (the last entry beyond the end). The caller (``workbook.run.constraints.cases``) builds
the plans per steering mode:

- ``allowed``   a token the request's constraint allows at every position,
- ``greedy``    the target's own greedy output for the same request (method ``none``'s),
- ``forbidden`` a token the constraint forbids (it must never be emitted).

Requests are matched by their prompt token ids (``add_requests``' ``prompt_token_ids``), as the
row check matches them. ``steered`` counts the rows replaced; ``errors`` keeps why a step could
not be steered (a moved attribute in another vLLM version), so a cell can say so instead of
claiming drafts it never placed. Reading ``total_len`` is a device read on a GPU (a
synchronization inside the step): the steer is for CPU grids and probes, never the tracer.
Removing it restores vLLM's ``propose`` exactly (``workbook.vllm.patching``).
"""

from __future__ import annotations

import inspect

from workbook.vllm import patching


class Steer:
    def __init__(self, runner, plans: dict[tuple, list[int]]):
        self.runner = runner
        self.plans = {tuple(int(t) for t in k): [int(t) for t in v] for k, v in plans.items()
                      if v}
        self.by_req: dict[str, list[int]] = {}
        self.counted: dict[str, int] = {}  # fallback output length (sum of num_sampled)
        self.steered = 0  # draft rows replaced
        self.prompt_of: dict[str, tuple] = {}
        self.by_prompt: dict[tuple, int] = {}  # draft rows replaced per request (its prompt)
        self.errors: list[str] = []
        self.ps: patching.PatchSet | None = None

    def install(self) -> "Steer":
        spec = getattr(self.runner, "speculator", None)
        if spec is None:
            self.errors.append("the model runner has no speculator (no drafter to steer)")
            return self
        ps = patching.PatchSet("steer", "fault")
        ps.wrap(type(self.runner), "add_requests", self._w_add_requests)
        ps.wrap(type(spec), "propose", self._w_propose)
        self.ps = ps.install()
        return self

    def remove(self) -> None:
        if self.ps is not None:
            self.ps.remove()
            self.ps = None

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.remove()
        return False

    def _w_add_requests(self, original):
        steer = self

        def add_requests(runner, scheduler_output, *a, **kw):
            steer.register(scheduler_output)
            return original(runner, scheduler_output, *a, **kw)

        return add_requests

    def register(self, scheduler_output) -> None:
        """The step's new requests that have a plan (by prompt) are steered from now on."""
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
            prompt = getattr(new, "prompt_token_ids", None)
            plan = self.plans.get(tuple(int(t) for t in prompt)) if prompt else None
            if plan is not None:
                self.by_req[new.req_id] = plan
                self.prompt_of[new.req_id] = tuple(int(t) for t in prompt)
                done = len(getattr(new, "prefill_token_ids", None) or prompt) - len(prompt)
                self.counted[new.req_id] = max(done, 0)

    def of(self, prompt) -> int:
        """Draft rows steered for the request with ``prompt``."""
        return self.by_prompt.get(tuple(int(t) for t in prompt), 0)

    def _out_len(self, rid: str, i: int, num_sampled) -> int:
        rs = getattr(self.runner, "req_states", None)
        try:
            idx = rs.req_id_to_index[rid]
            return int(rs.total_len.gpu[idx]) - int(rs.prompt_len.np[idx])
        except Exception:  # another vLLM's layout: count the sampled tokens ourselves
            if num_sampled is not None:
                self.counted[rid] = self.counted.get(rid, 0) + int(num_sampled[i])
            return self.counted.get(rid, 0)

    def _w_propose(self, original):
        steer = self
        try:
            sig = inspect.signature(original)
        except (TypeError, ValueError):
            sig = None

        def propose(spec, *a, **kw):
            drafts = original(spec, *a, **kw)
            if kw.get("dummy_run") or kw.get("is_profile") or not steer.by_req:
                return drafts
            try:
                bound = sig.bind(spec, *a, **kw).arguments if sig is not None else {}
                batch = bound.get("input_batch", a[0] if a else None)
                num_sampled = bound.get("num_sampled")
                ids = list(batch.req_ids)
                out = drafts.clone()
                k = out.shape[1]
                for i, rid in enumerate(ids[:out.shape[0]]):
                    plan = steer.by_req.get(rid)
                    if plan is None:
                        continue
                    n = steer._out_len(rid, i, num_sampled)
                    toks = [plan[min(n + j, len(plan) - 1)] for j in range(k)]
                    out[i] = out.new_tensor(toks)
                    steer.steered += 1
                    key = steer.prompt_of.get(rid)
                    steer.by_prompt[key] = steer.by_prompt.get(key, 0) + 1
                return out
            except Exception as e:  # keep vLLM's drafts, say why
                msg = f"steering skipped: {type(e).__name__}: {e}"
                if msg not in steer.errors:
                    steer.errors.append(msg[:300])
                return drafts

        return propose
