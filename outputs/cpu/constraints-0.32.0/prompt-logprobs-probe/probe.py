"""Hand probe: prompt_logprobs, stop strings, penalties per method (one engine)."""
import json, sys, contextlib, dataclasses
from workbook.run import constraints as C
from workbook.run import grid as G
from workbook.run import request as rq
from workbook.vllm import engine as E

method, out = sys.argv[1], sys.argv[2]
mnbt = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cfg = G.config_for(method)
if mnbt:
    cfg = dataclasses.replace(cfg, engine_kwargs={"max_num_batched_tokens": mnbt})
eng = E.start(cfg)
from vllm import SamplingParams
tok = eng.tokenizer
res = {"method": method, "mnbt": mnbt}
import vllm; res["version"] = vllm.__version__

def pl(x):
    if x is None: return None
    return [None if d is None else {int(k): float(v.logprob) for k, v in d.items()} for d in x]

def gen(prompts, sps):
    outs = eng.llm.generate(prompts, sps, use_tqdm=False)
    r = []
    for o in outs:
        c = o.outputs[0]
        r.append({"prompt_len": len(o.prompt_token_ids), "ids": [int(t) for t in c.token_ids],
                  "text": c.text, "finish": c.finish_reason, "stop_reason": c.stop_reason,
                  "logprobs": pl(c.logprobs), "prompt_logprobs": pl(o.prompt_logprobs)})
    return r

short = {"prompt_token_ids": C.prompt_for(tok, "prompt_logprobs")}
long_ids = C.prompt_for(tok, "a long prompt " + " ".join(str(i) for i in range(60)))
longp = {"prompt_token_ids": long_ids}
res["long_len"] = len(long_ids)
heads = {"natural": contextlib.nullcontext, "scaled": lambda: rq.scaled_lm_head(eng, 1e5),
         "zero": lambda: rq.zeroed_lm_head(eng)}
sp = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=3, logprobs=3, ignore_eos=True)
sp_long = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=3, logprobs=3, ignore_eos=True)
for h, ctx in heads.items():
    with ctx():
        try:
            res[f"pl_{h}_single"] = gen([short], [sp])
            res[f"pl_{h}_pair"] = gen([short, longp], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), sp_long])
            res[f"pl_{h}_both"] = gen([short, longp], [sp, sp_long])
        except Exception as e:
            res[f"pl_{h}_error"] = f"{type(e).__name__}: {e}"
# stop strings
with rq.zeroed_lm_head(eng):
    for sst in (True, False):
        base = gen([short], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, skip_special_tokens=sst)])[0]
        res[f"stop_base_sst{sst}"] = base
        res[f"decode0_sst{sst}"] = tok.decode([0], skip_special_tokens=sst)
        t = base["text"]
        if t:
            n = len(t) // 12 if len(t) >= 12 else 1
            stop = t[:3 * n] if n else t
            try:
                res[f"stop_sst{sst}"] = {"stop": stop, "out": gen([short], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, skip_special_tokens=sst, stop=[stop], logprobs=1)])[0]}
            except Exception as e:
                res[f"stop_sst{sst}"] = {"error": str(e)}
# natural text stop
base = gen([short], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)])[0]
res["nat_base"] = base
eng.shutdown()
json.dump(res, open(out, "w"), indent=1)
print("done", method)
