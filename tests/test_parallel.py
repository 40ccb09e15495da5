"""Tensor / pipeline parallel without an engine: the layout's validation, the CPU binding,
the rank columns of a merged trace and the agreement of the sampling ranks (docs/parallel.md)."""

import json
import os

import pandas as pd
import pytest

from workbook.core import ranks, tracefiles
from workbook.core.config import ConfigError, RunConfig, validate
from workbook.vllm import env, engine


@pytest.mark.parametrize("kw, words", [
    (dict(tensor_parallel_size=0), "tensor_parallel_size=0 must be"),
    (dict(pipeline_parallel_size=-1), "pipeline_parallel_size=-1 must be"),
    (dict(tensor_parallel_size=64), "= 64 ranks"),
    (dict(tensor_parallel_size=2, zero_lm_head=True), "zero_lm_head=True"),
    (dict(tensor_parallel_size=2, probes=True), "probes=True"),
    (dict(pipeline_parallel_size=2, constraint_fault="bias-target-row-only"), None),
    (dict(pipeline_parallel_size=2, spec_method="mtp"), "vLLM #52071"),
])
def test_a_parallel_layout_vllm_cannot_run_is_one_line_before_any_engine(kw, words):
    with pytest.raises(ConfigError) as e:
        validate(RunConfig(**kw), on_cpu=True)
    assert "\n" not in str(e.value)
    if words:
        assert words in str(e.value)


def test_tp2_maps_to_vllm_arguments_and_one_core_per_rank_on_cpu():
    cfg = RunConfig(tensor_parallel_size=2)
    assert engine.engine_kwargs(cfg)["tensor_parallel_size"] == 2
    assert "pipeline_parallel_size" not in engine.engine_kwargs(RunConfig())
    cores = sorted(os.sched_getaffinity(0))
    bind = env.vllm_env(cfg, cpu=True).get(env.CPU_BIND)
    if len(cores) >= 2:
        assert bind == f"{cores[0]}|{cores[1]}"
    assert env.CPU_BIND not in env.vllm_env(RunConfig(), cpu=True)
    assert env.CPU_BIND not in env.vllm_env(cfg, cpu=False)
    target = {env.CPU_BIND: "nobind"}
    env.apply({env.CPU_BIND: "0|1"}, target)
    assert target[env.CPU_BIND] == "nobind"  # the user's own binding wins


def _rank_trace(root, pid, tp, rows):
    d = root / str(pid)
    d.mkdir()
    (d / "rank.json").write_text(json.dumps({"pid": pid, "tp_rank": tp, "tp_size": 2,
                                             "pp_rank": 0, "pp_size": 1, "samples": True}))
    df = pd.DataFrame(rows, columns=tracefiles.REQUEST_COLUMNS[:len(rows[0])])
    tracefiles.save({"requests": df}, str(d))


def test_rank_columns_and_a_rank_whose_budget_state_differs_is_reported(tmp_path):
    cols = tracefiles.REQUEST_COLUMNS
    base = dict(step=1, req_id="r0", slot=0, phase="decode", path="rejection", enabled=True,
                use_thinking_budget=True, budget_host=1, budget_device=1, gate=True,
                fast_path=False, last_start=10, last_end=-1, emitted=[369])

    def row(**over):
        d = {**base, **over}
        return [d.get(c) for c in cols]

    _rank_trace(tmp_path, 101, 0, [row(), row(step=2, emitted=[5])])
    _rank_trace(tmp_path, 102, 1, [row(), row(step=2, emitted=[5])])
    frames = tracefiles.load(str(tmp_path))
    assert set(frames["requests"]["tp_rank"]) == {0, 1}
    agree = ranks.agreement(frames)
    assert agree["agree"] and agree["compared_rows"] == 2 and agree["ranks"] == ["pp0/tp0", "pp0/tp1"]
    assert len(ranks.of_rank(frames, 0, 1)["requests"]) == 2

    other = tmp_path / "b"
    other.mkdir()
    _rank_trace(other, 201, 0, [row(), row(step=2)])
    _rank_trace(other, 202, 1, [row(), row(step=2, budget_device=0)])
    agree = ranks.agreement(tracefiles.load(str(other)))
    assert not agree["agree"]
    assert agree["differences"] == [{"rank": "pp0/tp1", "step": 2, "req_id": "r0",
                                     "field": "budget_device", "reference": 1, "value": 0}]
