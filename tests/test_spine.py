"""The spine: real vLLM MRV2 on CPU, the reported request, checks A and B, effective config."""

from __future__ import annotations

import pytest

from workbook.core import models
from workbook.run import request

# speculator class names per method (0.29 / 0.32 spellings)
SPECULATORS = {"mtp": ("MTPSpeculator",), "eagle": ("EagleSpeculator",), "ngram": ("Ngram",),
               "draft_model": ("DraftModelSpeculator", "StandaloneARSpeculator")}


def test_tiny_models_are_deterministic(tmp_path):
    for name in models.MODELS:
        a = models.build(name, str(tmp_path / "a"))
        b = models.build(name, str(tmp_path / "b"))
        assert models.digest_of(a) == models.digest_of(b)
        assert models.build(name, str(tmp_path / "a")) == a  # cached


@pytest.mark.parametrize("spec_method", ["mtp", "none"])
def test_check_a_mtp_on_and_off(engines, spec_method):
    eng = engines(spec_method=spec_method)
    end = eng.effective["reasoning_end_token_ids"]
    for o in request.check_a(eng, budgets=(1, 0)):
        assert o.first_token == end[0], o.to_dict()
        assert o.honored is True


@pytest.mark.parametrize("spec_method", ["mtp", "eagle", "ngram", "draft_model", "none"])
def test_effective_config_reports_v2_and_speculator(engines, spec_method):
    eff = engines(spec_method=spec_method).effective
    assert eff["runner_is_v2"] is True and eff["use_v2_model_runner"] is True
    assert eff["thinking_budget_enabled"] is True
    assert eff["reasoning_start_token_ids"] and eff["reasoning_end_token_ids"]
    if spec_method == "none":
        assert eff["speculator_class"] is None
    else:
        assert any(n in eff["speculator_class"] for n in SPECULATORS[spec_method]), \
            eff["speculator_class"]
        assert eff["rejection_sampler_class"].endswith("RejectionSampler")


def test_reported_request_outcome_as_the_server_reports_it(engines):
    eng = engines(spec_method="mtp")
    o = request.run_reported(eng)[0]
    assert o.budget == 1 and o.max_tokens == 32
    assert o.completion_tokens == 32 and o.finish_reason == "length"
    assert o.prompt_tail[-2:] == [eng.effective["reasoning_start_token_ids"][0],
                                  eng.tokenizer.encode("\n", add_special_tokens=False)[0]]
    assert o.first_token_text == "</think>" and o.honored is True
    assert o.reasoning_tokens == 0  # the parser's count: nothing before </think> in the output
    assert o.content is not None


def test_check_b_exact_boundary_with_accepted_drafts(engines):
    eng = engines(spec_method="mtp")
    outs = request.check_b(eng, budgets=(2, 3, 6, 9))
    for o in outs:
        assert o.extra["check_b_prefix_ok"], (o.budget, o.token_ids)
        assert o.honored is True
    # the zeroed lm_head is restored: the model writes its usual first tokens again
    assert request.run_reported(eng, budget=None, max_tokens=2)[0].token_ids[0] != 0
