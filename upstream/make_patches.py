"""Regenerate upstream/vllm-<version>.diff from the installed vLLM sources (run from the repo root).

    python upstream/make_patches.py .venv-0.29 0.29.0 .venv 0.32.0

Each diff (``patch -p1`` from a directory holding ``vllm/``, i.e. a vLLM checkout) adds
``vllm/v1/worker/gpu/sample/thinking_budget_guard.py`` (upstream/src), its unit test
``tests/v1/worker/gpu/sample/test_thinking_budget_guard.py`` and five small edits to
``vllm/v1/worker/gpu/model_runner.py``: the import, the attribute, its construction next to the
Sampler, ``add_request`` / ``apply_staged_writes`` in ``add_requests``, and the ``apply`` call at
the end of ``GPUModelRunner.sample`` (before ``sample_tokens`` creates the AsyncOutput, commits
and proposes drafts).
"""

from __future__ import annotations

import difflib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = "vllm/v1/worker/gpu/model_runner.py"
GUARD = "vllm/v1/worker/gpu/sample/thinking_budget_guard.py"
TEST = "tests/v1/worker/gpu/sample/test_thinking_budget_guard.py"

EDITS = [  # (anchor, text inserted after it, or before it when the anchor starts with "<")
    ("from vllm.v1.worker.gpu.sample.sampler import Sampler\n",
     "from vllm.v1.worker.gpu.sample.thinking_budget_guard import ThinkingBudgetGuard\n"),
    ("        self.sampler: Sampler | None = None\n",
     "        self.thinking_budget_guard: ThinkingBudgetGuard | None = None\n"),
    ("<            custom = self.model_state.custom_sampler(self.sampler)\n",
     "            self.thinking_budget_guard = ThinkingBudgetGuard(\n"
     "                self.max_num_reqs,\n"
     "                self.device,\n"
     "                self.vllm_config.reasoning_config,\n"
     "            )\n"),
    ("<                assert self.prompt_logprobs_worker is not None\n"
     "                self.prompt_logprobs_worker.add_request(\n",
     "                if self.thinking_budget_guard is not None:\n"
     "                    self.thinking_budget_guard.add_request(\n"
     "                        req_index,\n"
     "                        new_req_data.sampling_params,\n"
     "                        new_req_data.prefill_token_ids,\n"
     "                    )\n"),
    ("        if self.sampler is not None:\n"
     "            self.sampler.apply_staged_writes()\n",
     "        if self.thinking_budget_guard is not None:\n"
     "            self.thinking_budget_guard.apply_staged_writes()\n"),
    ("<        return sampler_output, sampler_output.num_sampled, sampler_output.num_rejected\n",
     "        if self.thinking_budget_guard is not None:\n"
     "            # Enforce thinking budgets on the tokens about to be committed,\n"
     "            # whichever sampling path produced them.\n"
     "            self.thinking_budget_guard.apply(\n"
     "                sampler_output.sampled_token_ids,\n"
     "                sampler_output.num_sampled,\n"
     "                sampler_output.num_rejected,\n"
     "                global_input_batch.idx_mapping,\n"
     "                global_input_batch.idx_mapping_np,\n"
     "            )\n"),
]


def patched_runner(src: str) -> str:
    for anchor, text in EDITS:
        before = anchor.startswith("<")
        a = anchor[1:] if before else anchor
        if src.count(a) != 1:
            raise SystemExit(f"anchor found {src.count(a)} times (want 1): {a!r}")
        src = src.replace(a, text + a if before else a + text)
    return src


def udiff(old: str, new: str, path: str) -> str:
    a = f"a/{path}" if old else "/dev/null"
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 a, f"b/{path}", n=3)
    return "".join(lines)


def make(venv: str, version: str) -> str:
    site = os.path.join(venv, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                        "site-packages")
    with open(os.path.join(site, RUNNER)) as f:
        runner = f.read()
    with open(os.path.join(HERE, "src", "thinking_budget_guard.py")) as f:
        guard = f.read()
    with open(os.path.join(HERE, "src", "test_thinking_budget_guard.py")) as f:
        test = f.read()
    diff = (udiff("", guard, GUARD) + udiff(runner, patched_runner(runner), RUNNER)
            + udiff("", test, TEST))
    out = os.path.join(HERE, f"vllm-{version}.diff")
    with open(out, "w") as f:
        f.write(diff)
    return out


if __name__ == "__main__":
    args = sys.argv[1:] or [".venv-0.29", "0.29.0", ".venv", "0.32.0"]
    for venv, version in zip(args[::2], args[1::2]):
        print(make(venv, version))
