"""Stop string completed inside a step's accepted drafts: vLLM 0.28-0.31 return the tokens
after it (text cut right, token_ids and logprobs not). Run with a version venv, e.g.
    PYTHONPATH=$PWD /work/main/.venv-0.31/bin/python outputs/cpu/constraints-0.31.0/stop_strings_repro.py mtp
Method none, or 0.32's trimming (OutputProcessor._trim_surplus_tokens), gives [0, 0, 0]."""
import sys

from workbook.core import contracts
from workbook.run import constraints as C, grid as G, request as rq
from workbook.vllm import engine as E

eng = E.start(G.config_for(sys.argv[1] if len(sys.argv) > 1 else "mtp"))  # tiny-mimo-mtp, k=3
from vllm import SamplingParams  # after the engine's environment (Triton's interpreter on CPU)

sp = SamplingParams(temperature=0, max_tokens=12, stop=["!!!"], logprobs=1)  # token 0 is "!"
with rq.zeroed_lm_head(eng):  # every logit 0: greedy emits token 0, drafts are accepted
    o = eng.llm.generate([{"prompt_token_ids": C.prompt_for(eng.tokenizer, "stop_strings")}],
                         sp, use_tqdm=False)[0].outputs[0]
ids = list(o.token_ids)
texts = [eng.tokenizer.decode(ids[:i + 1], skip_special_tokens=True) for i in range(len(ids))]
print("token_ids", ids, "text", repr(o.text), "finish", o.finish_reason, "logprobs", len(o.logprobs))
for b in contracts.check_stop_strings(contracts.Params.of(sp), ids, o.text, texts, o.finish_reason):
    print("VIOLATED:", b.what)
eng.shutdown()
