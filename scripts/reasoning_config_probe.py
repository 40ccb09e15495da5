"""Plain vLLM (no workbook import): one engine with a given reasoning configuration, greedy
requests with thinking_token_budget, the output token ids printed as JSON lines. Usage:
  VLLM_USE_V2_MODEL_RUNNER=1 WORKBOOK_TRITON_CPU=1 python reasoning_config_probe.py MODEL_DIR \
      '{"reasoning_end_str": "</think>\n\n"}' none|mtp  [budgets, default 0,1,3,-1 (-1: none)]
(on the CPU the two variables switch on MRV2 through the venv's Triton shim; on a GPU drop them).
Prints one line per budget: {"budget", "token_ids", "text"} and the derived marker ids."""
import json
import sys

from vllm import LLM, SamplingParams
from vllm.config import ReasoningConfig

model, rc_json, spec = sys.argv[1], sys.argv[2], sys.argv[3]
budgets = [int(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "0,1,3,-1").split(",")]
rc = json.loads(rc_json)
kw = dict(model=model, load_format="dummy", seed=0, enforce_eager=True, max_model_len=256,
          max_num_seqs=8, kv_cache_memory_bytes=64 << 20, reasoning_parser="qwen3")
if rc:
    kw["reasoning_config"] = ReasoningConfig(**rc)
if spec == "mtp":
    kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 4}
try:
    llm = LLM(**kw)
except Exception as e:  # vLLM refused the configuration: its message
    print(json.dumps({"refused": f"{type(e).__name__}: {e}"}))
    raise SystemExit(3)
tok = llm.get_tokenizer()
rcfg = llm.llm_engine.vllm_config.reasoning_config
print(json.dumps({"start": rcfg.reasoning_start_token_ids, "end": rcfg.reasoning_end_token_ids,
                  "natural_end": rcfg.natural_reasoning_end_token_ids}))
text = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], tokenize=False,
                               add_generation_prompt=True, enable_thinking=True)
prompt = tok.encode(text, add_special_tokens=False)  # ends "<think>\n"
sps = [SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, thinking_token_budget=b)
       for b in budgets]
outs = llm.generate([{"prompt_token_ids": list(prompt)}] * len(budgets), sps, use_tqdm=False)
for b, o in zip(budgets, outs):
    print(json.dumps({"budget": b, "prompt_tail": list(prompt[-3:]),
                      "token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text}))
