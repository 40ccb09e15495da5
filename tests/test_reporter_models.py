"""Reporter-shaped model folders: ids, chat template, config shape (CPU only, no engine)."""

import json
import os

import pytest

from workbook.core import reporter_models as rm

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reporter-models"))
    return {name: rm.build_reporter(name, root) for name in rm.REPORTER_MODELS}


def test_build_is_deterministic_and_cached(folders, tmp_path):
    for name, path in folders.items():
        again = rm.build_reporter(name, str(tmp_path))
        assert os.path.basename(again) == os.path.basename(path)
        assert rm.build_reporter(name, os.path.dirname(path)) == path


def test_tokenizer_has_qwen_ids(folders):
    tok = transformers.AutoTokenizer.from_pretrained(folders["qwen3.5-27b-shape"])
    assert len(tok) == rm.VOCAB == 248320
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    assert enc("<think>") == [248068] and enc("</think>") == [248069]
    assert enc("\n") == [198] and enc("\n\n") == [271] and enc("2") == [17]
    assert enc("<|im_start|><|im_end|><|endoftext|>") == [248045, 248046, 248044]
    assert tok.eos_token_id == 248046
    assert tok.decode([248069, 271, 17, 248046]) == "</think>\n\n2<|im_end|>"
    assert tok.decode(enc("Héllo, wörld! 9.11\n\n  x")) == "Héllo, wörld! 9.11\n\n  x"


def test_chat_template_tail(folders):
    tok = transformers.AutoTokenizer.from_pretrained(folders["qwen3.5-27b-shape"])
    msgs = [{"role": "user", "content": "What is 1+1?"}]
    ids = lambda **kw: list(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False, **kw))
    assert ids()[-2:] == [248068, 198]
    assert ids(enable_thinking=True, preserve_thinking=True)[-2:] == [248068, 198]
    assert ids(enable_thinking=False)[-4:] == [248068, 271, 248069, 271]


def test_config_shape_and_quantization(folders):
    for name, path in folders.items():
        cfg = json.load(open(os.path.join(path, "config.json")))
        text = cfg["text_config"]
        assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
        assert (text["num_hidden_layers"], text["hidden_size"], text["intermediate_size"]) == (64, 5120, 17408)
        assert text["layer_types"].count("linear_attention") == 48
        assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (16, 48)
        assert text["vocab_size"] == 248320 and text["mtp_num_hidden_layers"] == 1
        qc = cfg.get("quantization_config")
        if name.endswith("-nvfp4"):
            assert (qc["quant_method"], qc["quant_algo"]) == ("modelopt", "NVFP4")
            assert {"lm_head", "mtp*", "model.visual*"} <= set(qc["ignore"])
            assert "model.language_model.layers.0.linear_attn.conv1d" in qc["ignore"]
        else:
            assert qc is None
        assert rm.reporter_engine_kwargs(name) == {"language_model_only": True,
                                                    "dtype": "bfloat16", "max_model_len": 262144}
