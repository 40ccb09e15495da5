"""The constraints grid's axes (``workbook.run.constraints.axes``, ``environments/constraints.yaml``): the
points of the axes given, their configurations, which points share an engine, the steering
plans and the validation — no engine here; the smoke cells on the MTP engine are in
tests/test_constraints.py (``test_axes_smoke_*``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbook.core.config import ConfigError, RunConfig
from workbook.run.constraints import axes as A
from workbook.run.constraints import grid as G

REPO = Path(__file__).resolve().parents[1]


def test_every_axis_of_the_issue_is_declared_with_its_default_first():
    p = G.plan("constraints", only="axes", on_cpu=True)
    assert set(p.axes) >= {"async_scheduling", "arrival", "preemption", "logprobs_mode",
                           "drafter", "reasoning"}
    assert list(p.axes["logprobs_mode"].values) == ["raw_logprobs", "processed_logprobs",
                                                    "raw_logits", "processed_logits"]
    assert [p.axes[n].default for n in ("async_scheduling", "arrival", "preemption",
                                        "drafter")] == ["off", "step0", "off", "as-is"]
    # vary: one -> the default point, then each other value alone
    assert p.points[0] == {n: p.axes[n].default for n in p.points[0]}
    assert all(sum(v != p.axes[n].default for n, v in pt.items()) == 1 for pt in p.points[1:])
    assert len(p.points) == 1 + sum(len(p.axes[n].values) - 1 for n in p.points[0])


def test_product_and_selection():
    known = A.parse({"arrival": ["step0", "staggered"],
                     "logprobs_mode": ["raw_logprobs", "raw_logits"]})
    sel = A.select(known, ["arrival", "logprobs_mode=raw_logits"])
    assert sel == {"arrival": ["step0", "staggered"], "logprobs_mode": ["raw_logits"]}
    assert A.points(known, sel) == [{"arrival": "step0", "logprobs_mode": "raw_logits"},
                                    {"arrival": "staggered", "logprobs_mode": "raw_logits"}]
    assert A.points(known, {}) == [{}]
    cfg = A.config(RunConfig(), known, {"arrival": "staggered", "logprobs_mode": "raw_logits"})
    assert (cfg.arrival, cfg.logprobs_mode) == ("staggered", "raw_logits")


def test_request_level_axes_share_an_engine_engine_level_ones_do_not():
    p = G.plan("constraints", only="axes", methods=["mtp"], on_cpu=True)
    groups, missing = G.engine_groups(p, "mtp")
    first = groups[0]
    changed = lambda pt: {n for n, v in pt.items() if v != p.axes[n].default}
    # arrival and the drafter steer ride on the default engine; async, preemption and every
    # logprobs mode each need their own
    assert {frozenset(changed(pt)) for pt in first} == {frozenset(), frozenset({"arrival"}),
                                                        frozenset({"drafter"})}
    assert all(len(g) == 1 for g in groups[1:])
    # method none has no drafter: the drafter axis runs at its default only
    none_groups, _ = G.engine_groups(p, "none")
    assert all(pt["drafter"] == "as-is" for g in none_groups for pt in g)
    # the reasoning axis without h-reasoning's fields: declared, not available, nothing runs
    if "reasoning_start_str" not in RunConfig.field_names():
        assert missing and all("not available" in why and "reasoning_start_str" in why
                               for _, why in missing)


@pytest.mark.parametrize("given,named", [
    (["nope"], "axis 'nope' is unknown"),
    (["logprobs_mode=raw"], "axis 'logprobs_mode': value 'raw' is unknown"),
    ({"drafter": ["sideways"]}, "axis 'drafter': value 'sideways' is unknown"),
])
def test_unknown_axis_or_value_is_named(given, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        G.plan("constraints", axes=given, on_cpu=True)


def test_malformed_axes_are_config_errors():
    with pytest.raises(ConfigError, match="unknown RunConfig field"):
        A.parse({"x": {"values": {"a": {"colour": 1}}}})
    with pytest.raises(ConfigError, match="needs a RunConfig field named"):
        A.parse({"colour": [1, 2]})
    with pytest.raises(ConfigError, match="verify='bogus'"):
        A.parse({"arrival": {"values": ["step0"], "verify": "bogus"}})


def test_an_axis_value_validate_rejects_names_the_point():
    known = A.parse({"k": {"values": {"bad": {"logprobs_mode": "raw"}}}})
    with pytest.raises(ConfigError, match="logprobs_mode='raw' is unknown"):
        A.config(RunConfig(), known, {"k": "bad"}) and \
            __import__("workbook.core.config").core.config.validate(
                A.config(RunConfig(), known, {"k": "bad"}))


@pytest.mark.parametrize("args,named", [
    (["--axis", "logprobs_mode=foo"], "axis 'logprobs_mode': value 'foo' is unknown"),
    (["--axis", "nope"], "axis 'nope' is unknown"),
    (["--set", 'engine_kwargs={"bogus_arg": 1}'], "engine_kwargs 'bogus_arg' is not an argument"),
    (["--set", "drafter_steer=allowed", "--methods", "none"], None),
])
def test_bad_axis_input_is_one_line_rc2(tmp_path, args, named):
    res = subprocess.run([sys.executable, "-m", "workbook.run.constraints.grid", *args, "--out", tmp_path],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert named is None or named in res.stderr
    assert not any(tmp_path.iterdir())


def test_steer_plans_follow_the_constraint():
    ref = [5, 5, 6]
    plan = lambda mode, kw: A.steer_plan(mode, "c", kw, ref)
    assert plan("greedy", {"allowed_token_ids": [5, 6, 7]}) == ref
    assert plan("allowed", {"allowed_token_ids": [5, 6, 7]}) == [7]
    assert plan("forbidden", {"allowed_token_ids": [0, 1, 5]}) == [2]
    assert plan("forbidden", {"min_tokens": 5, "stop_token_ids": [0]}) == [0]
    assert plan("forbidden", {"logit_bias": {0: -50.0, 5: 5.0}}) == [0]
    assert plan("allowed", {"min_tokens": 5, "stop_token_ids": [0]}) == [1]
    assert plan("forbidden", {"repetition_penalty": 1.5}) is None  # forbids nothing
    assert A.steer_plan("forbidden", "b", {"bad_words": ["ab"]}, ref,
                        encode=lambda w: [11, 12]) == [12]


# ---------------------------------------------------------------- the hunt's axes (issue 41)

def test_the_hunts_axes_are_declared_each_value_a_valid_configuration():
    p = G.plan("constraints", only="hunt", on_cpu=True)
    assert {"n", "prefix_cache", "chunked_prefill", "abort", "priority",
            "structured_after_reasoning"} <= set(p.axes) and "cudagraphs" in p.axes
    cfg = lambda pt: A.config(p.base, p.axes, {**p.points[0], **pt})
    assert cfg({"n": "3"}).n == 3
    shared = cfg({"prefix_cache": "shared"})
    assert shared.prompt_prefix > 32 and shared.engine_kwargs["enable_prefix_caching"] is True
    chunk = cfg({"chunked_prefill": "on"})
    assert chunk.prompt_prefix > chunk.engine_kwargs["max_num_batched_tokens"]  # several steps
    pre = cfg({"priority": "preempt"})
    assert pre.engine_kwargs["scheduling_policy"] == "priority" and pre.kv_blocks == 4
    assert p.axes["priority"].verify_of("preempt") == "preemption"
    assert p.axes["priority"].verify_of("mixed") is None
    assert p.axes["abort"].reference == {"mid-step": "none"}
    # request-level values share the default engine; engine-level ones get their own
    groups, _ = G.engine_groups(p, "mtp")
    first = {tuple(sorted((n, v) for n, v in pt.items() if v != p.axes[n].default))
             for pt in groups[0]}
    assert {(), (("n", "3"),), (("abort", "mid-step"),),
            (("structured_after_reasoning", "on"),)} <= first


def test_cuda_graph_values_are_refused_on_the_cpu_before_any_engine():
    with pytest.raises(ConfigError, match="value 'padded-3' needs a GPU"):
        G.plan("constraints", axes=["cudagraphs=eager,padded-3"], methods=["mtp"], on_cpu=True)
    p = G.plan("constraints", axes=["cudagraphs=eager,padded-5"], methods=["mtp"],
               on_cpu=False)
    assert A.config(p.base, p.axes, {"cudagraphs": "padded-5"}).enforce_eager is False
    assert p.hardware == "gpu"  # the CPU grid's file on a GPU host says where it ran


@pytest.mark.parametrize("over,named", [
    ({"n": 0}, "n=0 must be an integer in 1..8"),
    ({"priority": "mixed"}, "needs vLLM's priority scheduling"),
    ({"abort": "sideways"}, "abort='sideways' is unknown"),
    ({"abort": "mid-step", "arrival": "staggered"}, "own arrival schedule"),
    ({"prompt_prefix": 2000}, "must fit max_model_len"),
])
def test_bad_hunt_settings_name_what_is_wrong(over, named):
    from workbook.core.config import validate

    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        validate(RunConfig(**over), on_cpu=True)


def test_axis_keys_naming_missing_values_are_config_errors():
    with pytest.raises(ConfigError, match="reference names value 'x'"):
        A.parse({"k": {"values": {"a": {}, "b": {"n": 2}}, "reference": {"b": "x"}}})
    with pytest.raises(ConfigError, match="gpu_only names value 'c'"):
        A.parse({"k": {"values": {"a": {}, "b": {"n": 2}}, "gpu_only": ["c"]}})


def test_cpu_rehearsal_refuses_padded_graphs_in_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "workbook.run.constraints.grid", "--axis",
                          "cudagraphs=padded-3", "--methods", "mtp", "--out", tmp_path],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "needs a GPU" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())
