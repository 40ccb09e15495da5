"""Bad parameters fail with a clear message before any engine starts (vLLM is not even imported)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbook.core.config import ConfigError, RunConfig, validate

BAD = [
    ({"spec_method": "medusa2"}, "spec_method"),
    ({"thinking_token_budget": -2}, "thinking_token_budget"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": "/nonexistent/checkpoint"}, "model"),
    ({"runner": "v3"}, "runner"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"num_spec_tokens": 0}, "num_spec_tokens"),
    ({"mode": "grpc"}, "mode"),
    ({"fault": "H-z"}, "fault"),
    ({"model": "tiny-qwen2-draft", "spec_method": "mtp"}, "mtp"),
    ({"async_scheduling": True}, "async_scheduling"),
    ({"max_tokens": 2048, "max_model_len": 1024}, "max_model_len"),
]


@pytest.mark.parametrize("overrides,word", BAD)
def test_bad_parameter_is_rejected_with_its_name(overrides, word):
    with pytest.raises(ConfigError, match=word):
        validate(RunConfig(**overrides), on_cpu=True)


def test_unknown_parameter_names_it():
    with pytest.raises(ConfigError, match="budgett"):
        RunConfig.from_dict({"budgett": 1})


def test_runner_v1_rejected_where_vllm_removed_it(monkeypatch):
    import workbook.core.config as c

    monkeypatch.setattr(c, "installed_vllm_version", lambda: (0, 34, 0))
    with pytest.raises(ConfigError, match="removed in 0.34"):
        validate(RunConfig(runner="v1"), on_cpu=True)


def test_bad_parameters_fail_before_vllm_is_imported():
    code = (
        "import json, sys\n"
        "from workbook.vllm import engine\n"
        "from workbook.core.config import RunConfig, ConfigError\n"
        f"bad = json.loads({json.dumps(json.dumps([b for b, _ in BAD]))})\n"
        "errors = []\n"
        "for b in bad:\n"
        "    try:\n"
        "        engine.start(RunConfig(**b))\n"
        "    except ConfigError as e:\n"
        "        errors.append(str(e))\n"
        "print(json.dumps({'errors': errors, 'vllm': 'vllm' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(res["errors"]) == len(BAD)
    assert res["vllm"] is False
