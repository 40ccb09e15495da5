"""A Qwen3.5 model folder at the reporter's 27B shape, for dummy-weight runs on a GPU host.

    python3 scripts/qwen35_27b_shape.py OUTDIR [--max-position 262144]

The architecture of ``tiny-qwen3.5-mtp`` (``workbook.core.models``) at the shape of brief §7:
64 layers (48 Gated-DeltaNet + 16 full attention, every 4th), hidden 5120, intermediate 17408,
heads 24/4 (head_dim 256), linear heads 16 key / 48 value (dim 128), one MTP layer, vocab
248320, with a tokenizer that holds Qwen's ids (``<|endoftext|>`` 248044, ``<|im_start|>``
248045, ``<|im_end|>`` 248046, ``<think>`` 248068, ``</think>`` 248069; the chat template then
ends a prompt ``[248068, 198]`` as in the report). Use with ``load_format=dummy`` (the workbook
sets it only for its tiny names, so pass ``--set engine_kwargs='{load_format: dummy,
language_model_only: true, gdn_prefill_backend: triton}'``). About 27B parameters in bf16:
~54 GB of GPU memory. The tokenizer takes ~5 s to build (32 MB, not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from workbook.core import models  # noqa: E402

VOCAB = 248320
IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
       "<think>": 248068, "</think>": 248069}


def tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tm

    tok = Tokenizer(tm.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(models.CORPUS, trainers.BpeTrainer(
        vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))

    def pad(to):
        n = tok.get_vocab_size()
        tok.add_tokens([AddedToken(f"<|reserved_{i}|>", special=False, normalized=False)
                        for i in range(n, to)])

    pad(IDS["<|endoftext|>"])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    pad(IDS["<think>"])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<think>", "</think>")])
    pad(VOCAB)
    for t, i in IDS.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    assert tok.get_vocab_size() == VOCAB
    return tok


def config(max_position: int) -> dict:
    cfg = models._qwen35_mtp()
    text = cfg["text_config"]
    text.update({
        "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "max_position_embeddings": max_position, "vocab_size": VOCAB,
        "eos_token_id": IDS["<|im_end|>"]})
    cfg["vision_config"]["out_hidden_size"] = 5120
    cfg.update({"image_token_id": 248056, "video_token_id": 248057,
                "vision_start_token_id": 248053, "vision_end_token_id": 248054})
    return cfg


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--max-position", type=int, default=262144)
    a = ap.parse_args(argv)
    os.makedirs(a.outdir, exist_ok=True)
    tok = tokenizer()
    dump = lambda obj: json.dumps(obj, indent=1, sort_keys=True) + "\n"  # noqa: E731
    files = {"tokenizer.json": tok.to_str(pretty=False) + "\n",
             "tokenizer_config.json": dump({
                 "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
                 "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
                 "model_max_length": a.max_position, "add_prefix_space": False,
                 "chat_template": models.CHAT_TEMPLATE}),
             "config.json": dump(config(a.max_position)),
             "generation_config.json": dump({"eos_token_id": IDS["<|im_end|>"],
                                             "do_sample": False})}
    for name, text in files.items():
        with open(os.path.join(a.outdir, name), "w") as f:
            f.write(text)
    print(a.outdir)
    return a.outdir


if __name__ == "__main__":
    main()
