"""Regenerate upstream/vllm-<version>.diff from the installed vLLM sources (run from the repo root).

    python upstream/make_patches.py .venv-0.29 0.29.0 .venv 0.32.0

Each diff (``patch -p1`` from a directory holding ``vllm/``, i.e. a vLLM checkout) adds
``vllm/v1/worker/gpu/sample/thinking_budget_guard.py`` (upstream/src), its unit test
``tests/v1/worker/gpu/sample/test_thinking_budget_guard.py``, five small edits to
``vllm/v1/worker/gpu/model_runner.py`` (the import, the attribute, its construction next to the
Sampler, ``add_request`` / ``apply_staged_writes`` in ``add_requests``, and the ``apply`` call at
the end of ``GPUModelRunner.sample``: before ``sample_tokens`` creates the AsyncOutput, commits
and proposes drafts), and makes ``ThinkingBudgetState`` robust to a stray device write
(``BUDGET_EDITS`` on ``vllm/v1/worker/gpu/sample/thinking_budget.py``: the marker ids as
``tl.constexpr`` tuples in both kernels; ``check_markers()``, a sync-free comparison of the
device copies with a warning and a repair, called when requests are added) with its test
``tests/v1/worker/gpu/sample/test_thinking_budget_integrity.py`` (zeroes the marker storage in
place and still forces ``</think>``).
"""

from __future__ import annotations

import difflib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = "vllm/v1/worker/gpu/model_runner.py"
GUARD = "vllm/v1/worker/gpu/sample/thinking_budget_guard.py"
TEST = "tests/v1/worker/gpu/sample/test_thinking_budget_guard.py"
BUDGET = "vllm/v1/worker/gpu/sample/thinking_budget.py"
BUDGET_TEST = "tests/v1/worker/gpu/sample/test_thinking_budget_integrity.py"

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
     "                global_input_batch.idx_mapping_np,\n"
     "            )\n"),
]


# ThinkingBudgetState robustness (old, new, expected count): exact replacements in vllm/v1/worker/gpu/sample/thinking_budget.py
BUDGET_EDITS = [
    ("from vllm.sampling_params import SamplingParams\n",
     "from vllm.logger import init_logger\n"
     "from vllm.sampling_params import SamplingParams\n", 1),
    ("from vllm.utils.torch_utils import async_tensor_h2d\n",
     "from vllm.utils.platform_utils import is_pin_memory_available\n"
     "from vllm.utils.torch_utils import async_tensor_h2d\n", 1),
    ("_COLD_SCAN_BLOCK = 1024\n",
     "_COLD_SCAN_BLOCK = 1024\n\nlogger = init_logger(__name__)\n", 1),
    # __init__: the marker ids as Python ints (the kernels' compile-time constants)
    ("            end_ids, dtype=torch.int32, device=self.device\n        )\n",
     "            end_ids, dtype=torch.int32, device=self.device\n        )\n"
     "        # The kernels take the marker ids as compile-time constants, so a\n"
     "        # stray device write into the tensors above (vLLM #54906: zeroed\n"
     "        # during start-up, storage and _version unchanged) cannot disable\n"
     "        # the budget. The tensors are kept and checked by check_markers().\n"
     "        self._start_ids = tuple(int(t) for t in start_ids)\n"
     "        self._natural_end_ids = tuple(int(t) for t in natural_end_ids)\n"
     "        self._end_ids = tuple(int(t) for t in end_ids)\n"
     "        self.num_marker_corruptions = 0\n"
     "        self._marker_probe: torch.Tensor | None = None\n"
     "        self._marker_probe_event: torch.cuda.Event | None = None\n", 1),
    # check_markers, before add_request
    ("    def add_request(self, req_idx: int, sampling_params: SamplingParams)",
     "    def check_markers(self) -> bool:\n"
     "        \"\"\"Check the device copies of the marker ids against the ids the\n"
     "        kernels use, without a host sync: the device copies are read with a\n"
     "        non-blocking copy and compared once it completed (at once on CPU).\n"
     "        A mismatch (something else wrote into them) is logged, counted in\n"
     "        `num_marker_corruptions` and repaired. Returns False on a mismatch.\n"
     "        \"\"\"\n"
     "        if not self.enabled:\n"
     "            return True\n"
     "        ok = self._compare_marker_probe()\n"
     "        if self._marker_probe is None:\n"
     "            device_ids = torch.cat(\n"
     "                [\n"
     "                    self.reasoning_start_token_ids,\n"
     "                    self.natural_reasoning_end_token_ids,\n"
     "                    self.reasoning_end_token_ids,\n"
     "                ]\n"
     "            )\n"
     "            async_copy = device_ids.is_cuda and is_pin_memory_available()\n"
     "            probe = torch.empty(\n"
     "                device_ids.shape, dtype=torch.int32, pin_memory=async_copy\n"
     "            )\n"
     "            probe.copy_(device_ids, non_blocking=async_copy)\n"
     "            self._marker_probe = probe\n"
     "            self._marker_probe_event = None\n"
     "            if async_copy:\n"
     "                self._marker_probe_event = torch.cuda.Event()\n"
     "                self._marker_probe_event.record()\n"
     "            else:\n"
     "                ok = self._compare_marker_probe() and ok\n"
     "        return ok\n\n"
     "    def _compare_marker_probe(self) -> bool:\n"
     "        probe, event = self._marker_probe, self._marker_probe_event\n"
     "        if probe is None or (event is not None and not event.query()):\n"
     "            return True\n"
     "        self._marker_probe = None\n"
     "        seen = probe.tolist()\n"
     "        expected = list(self._start_ids + self._natural_end_ids + self._end_ids)\n"
     "        if seen == expected:\n"
     "            return True\n"
     "        self.num_marker_corruptions += 1\n"
     "        logger.warning(\n"
     "            \"ThinkingBudgetState: the reasoning marker ids on the device were \"\n"
     "            \"overwritten by something else (device: %s, expected: %s); the \"\n"
     "            \"budget kernels use the expected ids, the device copies are \"\n"
     "            \"restored. This is memory corruption.\",\n"
     "            seen,\n"
     "            expected,\n"
     "        )\n"
     "        for t, ids in (\n"
     "            (self.reasoning_start_token_ids, self._start_ids),\n"
     "            (self.natural_reasoning_end_token_ids, self._natural_end_ids),\n"
     "            (self.reasoning_end_token_ids, self._end_ids),\n"
     "        ):\n"
     "            t.copy_(torch.tensor(ids, dtype=torch.int32))\n"
     "        return False\n\n"
     "    def add_request(self, req_idx: int, sampling_params: SamplingParams)", 1),
    # apply_staged_writes: check when requests are added
    ("        if self._reset_reqs:\n            idx = async_tensor_h2d(",
     "        if self._reset_reqs:\n            self.check_markers()\n"
     "            idx = async_tensor_h2d(", 1),
    # apply: pass the ids, not the tensors
    ("            self.reasoning_start_token_ids,\n"
     "            self.natural_reasoning_end_token_ids,\n"
     "            self.reasoning_end_token_ids,\n        )\n",
     "            self._start_ids,\n            self._natural_end_ids,\n"
     "            self._end_ids,\n        )\n", 1),
    # kernels: marker ids as tl.constexpr tuples
    ("    reasoning_start_token_ids_ptr,\n    natural_reasoning_end_token_ids_ptr,\n"
     "    START_LEN: tl.constexpr,\n    NATURAL_END_LEN: tl.constexpr,\n"
     "    MAX_LEN: tl.constexpr,\n",
     "    START_IDS: tl.constexpr,\n    NATURAL_END_IDS: tl.constexpr,\n"
     "    START_LEN: tl.constexpr,\n    NATURAL_END_LEN: tl.constexpr,\n"
     "    MAX_LEN: tl.constexpr,\n", 1),
    ("    reasoning_start_token_ids_ptr,\n    natural_reasoning_end_token_ids_ptr,\n"
     "    reasoning_end_token_ids_ptr,\n    START_LEN: tl.constexpr,\n",
     "    START_IDS: tl.constexpr,\n    NATURAL_END_IDS: tl.constexpr,\n"
     "    END_IDS: tl.constexpr,\n    START_LEN: tl.constexpr,\n", 1),
    ("expected = tl.load(reasoning_start_token_ids_ptr + j)", "expected = START_IDS[j]", 3),
    ("expected = tl.load(natural_reasoning_end_token_ids_ptr + j)",
     "expected = NATURAL_END_IDS[j]", 3),
    ("expected = tl.load(reasoning_end_token_ids_ptr + j)", "expected = END_IDS[j]", 1),
    ("    force_token_id = tl.load(reasoning_end_token_ids_ptr + end_prefix_len)\n",
     "    force_token_id = tl.full([], END_IDS[0], tl.int32)\n"
     "    for k in tl.static_range(1, END_LEN):\n"
     "        force_token_id = tl.where(end_prefix_len == k, END_IDS[k], force_token_id)\n", 1),
    # the launcher: ids (or tensors, read once) -> constexpr tuples
    ("    reasoning_start_token_ids: torch.Tensor,\n"
     "    natural_reasoning_end_token_ids: torch.Tensor,\n"
     "    reasoning_end_token_ids: torch.Tensor,\n",
     "    reasoning_start_token_ids: Sequence[int] | torch.Tensor,\n"
     "    natural_reasoning_end_token_ids: Sequence[int] | torch.Tensor,\n"
     "    reasoning_end_token_ids: Sequence[int] | torch.Tensor,\n", 1),
    ("    start_len = reasoning_start_token_ids.shape[0]\n"
     "    natural_end_len = natural_reasoning_end_token_ids.shape[0]\n"
     "    end_len = reasoning_end_token_ids.shape[0]\n",
     "    # Compile-time constants of the kernels (a tensor is read once here).\n"
     "    start_ids = _as_ids(reasoning_start_token_ids)\n"
     "    natural_end_ids = _as_ids(natural_reasoning_end_token_ids)\n"
     "    end_ids = _as_ids(reasoning_end_token_ids)\n"
     "    start_len = len(start_ids)\n"
     "    natural_end_len = len(natural_end_ids)\n"
     "    end_len = len(end_ids)\n", 1),
    ("        reasoning_start_token_ids,\n        natural_reasoning_end_token_ids,\n"
     "        START_LEN=start_len,\n",
     "        START_IDS=start_ids,\n        NATURAL_END_IDS=natural_end_ids,\n"
     "        START_LEN=start_len,\n", 1),
    ("        reasoning_start_token_ids,\n        natural_reasoning_end_token_ids,\n"
     "        reasoning_end_token_ids,\n        START_LEN=start_len,\n",
     "        START_IDS=start_ids,\n        NATURAL_END_IDS=natural_end_ids,\n"
     "        END_IDS=end_ids,\n        START_LEN=start_len,\n", 1),
    ("def apply_thinking_budget(\n",
     "def _as_ids(ids: Sequence[int] | torch.Tensor) -> tuple[int, ...]:\n"
     "    if isinstance(ids, torch.Tensor):\n"
     "        ids = ids.tolist()\n"
     "    return tuple(int(t) for t in ids)\n\n\n"
     "def apply_thinking_budget(\n", 1),
    ("from typing import TYPE_CHECKING\n",
     "from collections.abc import Sequence\nfrom typing import TYPE_CHECKING\n", 1),
]


def patched_budget(src: str) -> str:
    for old, new, n in BUDGET_EDITS:
        if src.count(old) != n:
            raise SystemExit(f"budget edit found {src.count(old)} times (want {n}): {old[:70]!r}")
        src = src.replace(old, new)
    return src


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
    with open(os.path.join(site, BUDGET)) as f:
        budget_src = f.read()
    with open(os.path.join(HERE, "src", "test_thinking_budget_integrity.py")) as f:
        budget_test = f.read()
    diff = (udiff("", guard, GUARD) + udiff(runner, patched_runner(runner), RUNNER)
            + udiff(budget_src, patched_budget(budget_src), BUDGET)
            + udiff("", test, TEST) + udiff("", budget_test, BUDGET_TEST))
    out = os.path.join(HERE, f"vllm-{version}.diff")
    with open(out, "w") as f:
        f.write(diff)
    return out


if __name__ == "__main__":
    args = sys.argv[1:] or [".venv-0.29", "0.29.0", ".venv", "0.32.0"]
    for venv, version in zip(args[::2], args[1::2]):
        print(make(venv, version))
