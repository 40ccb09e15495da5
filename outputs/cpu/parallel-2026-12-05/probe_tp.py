# plain vLLM (+ the CPU triton shim via .pth env var) : TP/PP on CPU with MRV2 + MTP
import os, sys, time, json
tp = int(sys.argv[1]); pp = int(sys.argv[2]); spec = sys.argv[3] if len(sys.argv) > 3 else "mtp"
os.environ.update(HF_HUB_OFFLINE="1", VLLM_USE_V2_MODEL_RUNNER="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                  VLLM_TRITON_FORCE_FIRST_CONFIG="1", WORKBOOK_TRITON_CPU="1")
def main():
    from workbook.core import models
    from workbook.vllm import cpu_shim; cpu_shim.install()
    path = models.build("tiny-mimo-mtp")
    import vllm
    from vllm import LLM, SamplingParams
    kw = dict(model=path, load_format="dummy", enforce_eager=True, reasoning_parser="qwen3", max_model_len=1024,
              max_num_seqs=8, seed=0, kv_cache_memory_bytes=64<<20, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    if spec == "mtp":
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 4}
    t = time.time()
    llm = LLM(**kw)
    print("STARTED", time.time() - t, flush=True)
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], tokenize=False, add_generation_prompt=True, enable_thinking=True)
    sp = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, thinking_token_budget=1)
    out = llm.generate([prompt], sp)
    ids = list(out[0].outputs[0].token_ids)
    print("TOKENS", ids, "end id", tok.convert_tokens_to_ids("</think>"), flush=True)
    import subprocess
    print(subprocess.run(["ps", "-o", "pid,ppid,rss,cmd", "--ppid", str(os.getpid())], capture_output=True, text=True).stdout)

if __name__ == '__main__':
    main()
