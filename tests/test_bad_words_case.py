"""The grid's bad_words case against vLLM's own validation (``SamplingParams``, the tiny model's
tokenizer): on the H100's dummy weights the unconstrained output began with ``\\n``, the case
banned ``'\\n'``, and vLLM 0.34 refused it ("bad_words entries must tokenize to at least one
token": it strips a bad word's leading whitespace). The case now starts at the first token with
text of its own; where the first token has text, it is unchanged."""

from workbook.core import contracts, models
from workbook.run.constraints import grid as G


def _tok():
    from vllm.tokenizers import get_tokenizer  # the tokenizer as vLLM's processor holds it

    return get_tokenizer(models.build(G.config_for("none").model))


def test_bad_words_case_is_one_vllm_accepts():
    from vllm import SamplingParams

    tok = _tok()
    nl = tok.encode("\n", add_special_tokens=False)
    word = tok.convert_tokens_to_ids("<|reserved_1045|>")
    assert len(nl) == 1 and tok.decode(nl).strip() == ""
    cases = {
        "whitespace first": (nl * 2 + [word, 12], [tok.decode([word]), tok.decode([12, word])]),
        "text first": ([word, 12], [tok.decode([word]), tok.decode([12, word])]),
        "zeroed head": ([0] * 16, [tok.decode([0])]),
    }
    for name, (baseline, want) in cases.items():
        kw = contracts.case_kwargs("bad_words", baseline, tok.decode)
        assert kw["bad_words"] == want, name
        sp = SamplingParams(max_tokens=4, **kw)
        sp.update_from_tokenizer(tok)  # vLLM's validation: raises on a word left empty
        assert sp.bad_words_token_ids and all(sp.bad_words_token_ids), name
