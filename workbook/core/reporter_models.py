"""Reporter-shaped model folders for vLLM: Qwen3.5 ("Qwen3.8") at the 27B shape, no weights.

Same idea as ``models.py`` (config + tokenizer built from constants, ``load_format="dummy"``
fills the weights), but at the shape of the model in vLLM #54906 and with a tokenizer whose ids
are Qwen's where the issue depends on them, so token ids read off a run compare directly with
the reporter's log.

Models (``REPORTER_MODELS``):
- ``qwen3.5-27b-shape`` — ``Qwen3_5ForConditionalGeneration`` at Qwen3.5-27B's text shape:
  64 layers (``[linear, linear, linear, full] * 16``: 48 Gated-DeltaNet + 16 full attention),
  hidden 5120, intermediate 17408, attention heads 24 / KV 4, head_dim 256 with an output gate,
  GDN key heads 16 / value heads 48 (head dims 128, conv kernel 4), partial RoPE 0.25 (mrope
  interleaved, sections [11, 11, 10], theta 1e7), one MTP layer, vocab 248320, max positions
  262144. The vision tower is described (27-layer Qwen3.5 ViT) but not built:
  ``language_model_only=True``. bf16: about 54 GB of weights plus KV/mamba cache, so an
  H100/H200-class GPU; it does not run on CPU.
- ``qwen3.5-27b-shape-nvfp4`` — the same with a ModelOpt NVFP4 ``quantization_config`` in the
  form ModelOpt's Hugging Face export writes into ``config.json`` (``quant_method: modelopt``,
  ``quant_algo: NVFP4``, ``config_groups`` with 4-bit float weights and activations in groups of
  16, an ``ignore`` list). vLLM selects ``modelopt_fp4`` by itself and, with dummy weights,
  creates the packed FP4 weights and scales (on Hopper through Marlin W4A16). Kept in bf16 as
  ModelOpt's defaults for Qwen3.5 keep them: ``lm_head``, the vision tower, the MTP module, and
  per GDN layer ``conv1d``, ``in_proj_a``, ``in_proj_b``.

Tokenizer: byte-level BPE written directly (no training, so 248k ids build in about a second):
ids 0..255 are the 256 byte symbols in GPT-2 ``bytes_to_unicode`` order, as in Qwen2/3/3.5 (so
``"\\n"`` is 198, ``" "`` 220, ``"2"`` 17); one merge ``"\\n\\n"`` -> 271 (Qwen's id); the other
base ids up to 248043 are unreachable filler symbols (they decode to ``<|bpe_filler_N|>``);
Qwen3.5's added tokens at their ids (``<|endoftext|>`` 248044, ``<|im_start|>`` 248045,
``<|im_end|>`` 248046, vision tokens 248053..248057, ``<tool_call>`` 248058, ``<think>`` 248068,
``</think>`` 248069, ...); reserved tokens up to exactly 248320 ids so every sampled id decodes.
NFC normalizer, Qwen3.5's split pattern + byte-level pre-tokenizer, byte-level decoder:
transformers' ``Qwen3_5Tokenizer`` (which ``AutoTokenizer`` picks for ``model_type: qwen3_5``)
and ``Qwen2Tokenizer`` rebuild this pipeline from ``vocab``/``merges`` (Qwen2's pattern lacks the
``\\p{M}`` classes; same ids otherwise).
Ordinary text encodes byte by byte: ids match Qwen's for single bytes, ``"\\n\\n"`` and the added
tokens only — not for words.

The chat template ends the generation prompt with ``<|im_start|>assistant\\n<think>\\n`` (prompt
tail ``[248068, 198]``, as in the report), or ``<think>\\n\\n</think>\\n\\n`` when
``enable_thinking`` is false; ``preserve_thinking`` keeps earlier assistant turns' reasoning.

Not here: real weights or real merges (outputs are random-weight tokens), the vision tower's
weights, hf_quant_config.json (vLLM reads ``config.json``'s ``quantization_config`` first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from workbook.core.cache import cache_root

VOCAB = 248320
BASE_VOCAB = 248044  # ids 0..248043: the BPE model's own vocabulary; added tokens follow
NUM_LAYERS = 64
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
BUILD_VERSION = 1  # bump when a builder changes, so caches rebuild

# Qwen3.5's added tokens at their ids (special?). Anchors read from public Qwen3.5 configs and
# the issue: 248044-248046, 248053/54/56/57, 248058, 248068/69; the rest follow Qwen3's order.
ADDED = [
    (248044, "<|endoftext|>", True), (248045, "<|im_start|>", True),
    (248046, "<|im_end|>", True), (248047, "<|object_ref_start|>", True),
    (248048, "<|object_ref_end|>", True), (248049, "<|box_start|>", True),
    (248050, "<|box_end|>", True), (248051, "<|quad_start|>", True),
    (248052, "<|quad_end|>", True), (248053, "<|vision_start|>", True),
    (248054, "<|vision_end|>", True), (248055, "<|vision_pad|>", True),
    (248056, "<|image_pad|>", True), (248057, "<|video_pad|>", True),
    (248058, "<tool_call>", False), (248059, "</tool_call>", False),
    (248060, "<|fim_prefix|>", False), (248061, "<|fim_middle|>", False),
    (248062, "<|fim_suffix|>", False), (248063, "<|fim_pad|>", False),
    (248064, "<|repo_name|>", False), (248065, "<|file_sep|>", False),
    (248066, "<tool_response>", False), (248067, "</tool_response>", False),
    (248068, "<think>", False), (248069, "</think>", False),
]
IDS = {tok: i for i, tok, _ in ADDED}
MERGES = {271: ("Ċ", "Ċ")}  # id -> merged pair ("\n\n" is 271 in Qwen's vocabulary)

# Qwen3.5's split pattern (transformers' Qwen3_5Tokenizer; Qwen2's lacks the \p{M} classes)
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                     r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set reasoning = message.reasoning_content or message.reasoning or '' %}"
    "{%- if reasoning and preserve_thinking is defined and preserve_thinking %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n'"
    " + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


def bytes_to_unicode() -> list[tuple[int, str]]:
    """The 256 (byte, symbol) pairs in GPT-2's order: printable bytes first, the rest shifted
    to U+0100 onwards. Position in this list = token id in Qwen's vocabulary."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [(b, chr(c)) for b, c in zip(bs, cs)]


def _qwen35_27b_text() -> dict:
    return {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": NUM_LAYERS, "layer_types": LAYER_TYPES * (NUM_LAYERS // 4),
        "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 256, "attn_output_gate": True, "attention_bias": False,
        "attention_dropout": 0.0, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "output_gate_type": "swish", "mamba_ssm_dtype": "float32", "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "initializer_range": 0.02, "max_position_embeddings": 262144,
        "mlp_only_layers": [], "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [11, 11, 10]},
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "vocab_size": VOCAB, "tie_word_embeddings": False, "use_cache": True,
        "bos_token_id": None, "eos_token_id": IDS["<|endoftext|>"], "pad_token_id": None,
        "dtype": "bfloat16",
    }


def _qwen35_27b() -> dict:
    vision = {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152,
              "intermediate_size": 4304, "num_heads": 16, "in_channels": 3, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 5120,
              "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
              "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": _qwen35_27b_text(), "vision_config": vision,
            "tie_word_embeddings": False, "image_token_id": IDS["<|image_pad|>"],
            "video_token_id": IDS["<|video_pad|>"],
            "vision_start_token_id": IDS["<|vision_start|>"],
            "vision_end_token_id": IDS["<|vision_end|>"],
            "eos_token_id": IDS["<|im_end|>"], "pad_token_id": IDS["<|endoftext|>"],
            "dtype": "bfloat16", "transformers_version": "5.0.0"}


def nvfp4_ignore() -> list[str]:
    """Modules a ModelOpt NVFP4 export of Qwen3.5 leaves in bf16, as HF checkpoint names."""
    out = ["lm_head", "model.visual*", "mtp*"]
    for i in range(NUM_LAYERS):
        if LAYER_TYPES[i % 4] == "linear_attention":
            out += [f"model.language_model.layers.{i}.linear_attn.{m}"
                    for m in ("conv1d", "in_proj_a", "in_proj_b")]
    return out


def nvfp4_quantization_config() -> dict:
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    return {"quant_method": "modelopt", "quant_algo": "NVFP4",
            "producer": {"name": "modelopt", "version": "0.39.0"},
            "config_groups": {"group_0": {"input_activations": dict(fp4),
                                          "weights": dict(fp4), "targets": ["Linear"]}},
            "ignore": nvfp4_ignore()}


def _qwen35_27b_nvfp4() -> dict:
    return dict(_qwen35_27b(), quantization_config=nvfp4_quantization_config())


_ENGINE = {"language_model_only": True, "dtype": "bfloat16", "max_model_len": 262144}

# name -> (config builder, engine kwargs the model needs); same layout as models.MODELS
REPORTER_MODELS: dict[str, tuple] = {
    "qwen3.5-27b-shape": (_qwen35_27b, dict(_ENGINE)),
    "qwen3.5-27b-shape-nvfp4": (_qwen35_27b_nvfp4, dict(_ENGINE)),
}


def is_reporter(name: str) -> bool:
    return name in REPORTER_MODELS


def reporter_engine_kwargs(name: str) -> dict:
    return dict(REPORTER_MODELS[name][1]) if name in REPORTER_MODELS else {}


def build_tokenizer():
    """The Qwen-id tokenizer (a ``tokenizers.Tokenizer``), built directly, no training."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    vocab = {sym: i for i, (_, sym) in enumerate(bytes_to_unicode())}
    merges = []
    for i, (a, b) in sorted(MERGES.items()):
        vocab[a + b] = i
        merges.append((a, b))
    taken = set(vocab.values())
    vocab.update({f"<|bpe_filler_{i}|>": i for i in range(256, BASE_VOCAB) if i not in taken})
    assert sorted(vocab.values()) == list(range(BASE_VOCAB))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for i, text, special in ADDED:  # one by one: ids are assigned in order
        assert tok.get_vocab_size() == i, (text, tok.get_vocab_size())
        t = AddedToken(text, special=special, normalized=False)
        tok.add_special_tokens([t]) if special else tok.add_tokens([t])
    n = tok.get_vocab_size()
    tok.add_tokens([AddedToken(f"<|reserved_{i}|>", special=False, normalized=False)
                    for i in range(n, VOCAB)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, text, _ in ADDED:
        assert tok.token_to_id(text) == i, text
    return tok


def _files(name: str) -> dict[str, bytes]:
    """Every file of the model folder as bytes (deterministic)."""
    tok = build_tokenizer()
    dump = lambda obj: (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    tok_cfg = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
               "model_max_length": 262144, "add_prefix_space": False, "errors": "replace",
               "split_special_tokens": False, "chat_template": CHAT_TEMPLATE}
    gen = {"eos_token_id": [IDS["<|im_end|>"], IDS["<|endoftext|>"]],
           "pad_token_id": IDS["<|endoftext|>"], "do_sample": False}
    return {"tokenizer.json": tok.to_str(pretty=False).encode() + b"\n",
            "tokenizer_config.json": dump(tok_cfg),
            "config.json": dump(REPORTER_MODELS[name][0]()),
            "generation_config.json": dump(gen)}


def build_reporter(name: str, root: str | None = None) -> str:
    """Build (or reuse) the model folder ``name``; returns its path. Idempotent and atomic."""
    if name not in REPORTER_MODELS:
        raise ValueError(f"unknown reporter model {name!r}; known: {sorted(REPORTER_MODELS)}")
    files = _files(name)
    h = hashlib.sha256()
    for fname, data in sorted(files.items()):
        h.update(fname.encode() + b"\0" + hashlib.sha256(data).digest())
    root = root or os.path.join(cache_root(), "models")
    out = os.path.join(root, f"{name}-v{BUILD_VERSION}-{h.hexdigest()[:12]}")
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
