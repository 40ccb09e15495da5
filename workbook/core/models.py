"""Tiny offline model folders for vLLM: config + locally trained tokenizer, no weights.

vLLM fills random weights with ``load_format="dummy"`` (uniform ±1e-3, seeded), so a folder with
``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json`` is a
complete model. Every folder here is built from constants only: the same bytes on every build,
no network, cached under ``$WORKBOOK_CACHE/models/<name>-<content hash>``.

Models (``MODELS``):
- ``tiny-mimo-mtp`` — dense Qwen2-style ``MiMoForCausalLM`` with one MTP layer. Fast on CPU.
  The default of the CPU investigation.
- ``tiny-qwen3.5-mtp`` — the reporter's architecture (``Qwen3_5ForConditionalGeneration``: 3
  Gated-DeltaNet + 1 full-attention layers, one MTP layer). Slow under Triton's interpreter.
- ``tiny-llama-eagle`` — a one-layer EAGLE head (``EagleLlamaForCausalLM``) for ``tiny-mimo-mtp``.
- ``tiny-qwen2-draft`` — a one-layer dense draft model for ``draft_model`` speculation.

The tokenizer is byte-level BPE with Qwen's special tokens and single-token ``<think>`` /
``</think>`` (not special, as in Qwen3), padded with reserved tokens to exactly ``VOCAB`` ids so
every sampled id decodes. Its chat template honours ``enable_thinking``.

Reporter-shaped models (Qwen3.5 at the 27B shape, bf16 and ModelOpt NVFP4, Qwen's token ids)
live in ``workbook.core.reporter_models``; ``build`` / ``is_builtin`` / ``model_engine_kwargs``
serve both. Not here: real checkpoints (pass a path instead), weights of any kind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from workbook.core.cache import cache_root  # noqa: F401  (re-exported)

VOCAB = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
CORPUS = ["Hello world. What is 9.11 versus 9.8? Let me think step by step.",
          "The quick brown fox jumps over the lazy dog.", "user assistant system",
          "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ?"] * 50
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)
BUILD_VERSION = 1  # bump when a builder changes, so caches rebuild


def _qwen2_text(layers: int, **extra) -> dict:
    cfg = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": layers,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "initializer_range": 0.02,
           "max_position_embeddings": 4096, "rope_theta": 10000.0, "vocab_size": VOCAB,
           "tie_word_embeddings": False, "use_cache": True, "attention_dropout": 0.0,
           "bos_token_id": None, "eos_token_id": None, "torch_dtype": "bfloat16"}
    cfg.update(extra)
    return cfg


def _mimo_mtp() -> dict:
    return dict(_qwen2_text(2), architectures=["MiMoForCausalLM"], model_type="qwen2",
                num_nextn_predict_layers=1, use_sliding_window=False)


def _qwen2_draft() -> dict:
    return dict(_qwen2_text(1), architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                use_sliding_window=False)


def _llama_eagle() -> dict:
    cfg = _qwen2_text(1, model_type="llama", architectures=["EagleLlamaForCausalLM"])
    cfg.pop("head_dim")
    return cfg


def _qwen35_mtp() -> dict:
    text = {
        "model_type": "qwen3_5_text", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 256, "attn_output_gate": True, "attention_bias": False,
        "attention_dropout": 0.0, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "output_gate_type": "swish", "mamba_ssm_dtype": "float32", "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "initializer_range": 0.02, "max_position_embeddings": 4096,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [11, 11, 10]},
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "vocab_size": VOCAB, "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "dtype": "bfloat16",
    }
    vision = {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 64,
              "intermediate_size": 128, "num_heads": 2, "in_channels": 3, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 256,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [],
              "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": text, "vision_config": vision, "tie_word_embeddings": False,
            "image_token_id": VOCAB - 1, "video_token_id": VOCAB - 2,
            "vision_start_token_id": VOCAB - 3, "vision_end_token_id": VOCAB - 4,
            "dtype": "bfloat16"}


# name -> (config builder, engine kwargs the model needs)
MODELS: dict[str, tuple] = {
    "tiny-mimo-mtp": (_mimo_mtp, {}),
    "tiny-qwen3.5-mtp": (_qwen35_mtp, {"language_model_only": True, "dtype": "bfloat16"}),
    "tiny-llama-eagle": (_llama_eagle, {}),
    "tiny-qwen2-draft": (_qwen2_draft, {}),
}


def names() -> list[str]:
    """Every model the workbook builds offline: the tiny ones and the reporter-shaped ones
    (``workbook.core.reporter_models``)."""
    from workbook.core import reporter_models

    return sorted(MODELS) + sorted(reporter_models.REPORTER_MODELS)


def is_builtin(name: str) -> bool:
    """A model the workbook builds itself (config + tokenizer; vLLM fills dummy weights)."""
    from workbook.core import reporter_models

    return name in MODELS or reporter_models.is_reporter(name)


def has_mtp(name: str) -> bool:
    """A built-in model with MTP layers (``spec_method='mtp'`` needs one)."""
    from workbook.core import reporter_models

    return name.endswith("-mtp") or reporter_models.is_reporter(name)


def model_engine_kwargs(name: str) -> dict:
    """Engine arguments a built-in model needs (e.g. Qwen3.5's ``language_model_only``)."""
    from workbook.core import reporter_models

    if reporter_models.is_reporter(name):
        return reporter_models.reporter_engine_kwargs(name)
    return dict(MODELS[name][1]) if name in MODELS else {}


def _config(name: str, eos: int) -> dict:
    cfg = MODELS[name][0]()
    text = cfg.get("text_config", cfg)
    text["eos_token_id"] = eos
    return cfg


def _build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIAL) - len(ADDED),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    n = tok.get_vocab_size()
    tok.add_tokens([AddedToken(f"<|reserved_{i}|>", special=False, normalized=False)
                    for i in range(VOCAB - n)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def _files(name: str) -> dict[str, bytes]:
    """Every file of the model folder as bytes (deterministic)."""
    tok = _build_tokenizer()
    eos = tok.token_to_id("<|im_end|>")
    dump = lambda obj: (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    tok_cfg = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
               "model_max_length": 4096, "add_prefix_space": False,
               "chat_template": CHAT_TEMPLATE}
    return {"tokenizer.json": tok.to_str(pretty=False).encode() + b"\n",
            "tokenizer_config.json": dump(tok_cfg),
            "config.json": dump(_config(name, eos)),
            "generation_config.json": dump({"eos_token_id": eos, "do_sample": False})}


def build(name: str, root: str | None = None) -> str:
    """Build (or reuse) the model folder ``name``; returns its path. Idempotent and atomic."""
    from workbook.core import reporter_models

    if reporter_models.is_reporter(name):
        return reporter_models.build_reporter(name, root)
    if name not in MODELS:
        raise ValueError(f"unknown built-in model {name!r}; known: {names()}")
    files = _files(name)
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:12]
    root = root or os.path.join(cache_root(), "models")
    out = os.path.join(root, f"{name}-v{BUILD_VERSION}-{digest}")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    for fname, data in files.items():
        with open(os.path.join(tmp, fname), "wb") as f:
            f.write(data)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def digest_of(path: str) -> str:
    """sha256 over a model folder's files, for the manifest."""
    h = hashlib.sha256()
    for fname in sorted(os.listdir(path)):
        with open(os.path.join(path, fname), "rb") as f:
            h.update(fname.encode() + b"\0" + f.read())
    return h.hexdigest()
