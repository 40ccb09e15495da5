"""The mixed batch of every constraint on the tiny model's weights times 1e5 (each row its own
distribution; drafts mostly rejected), per method, one engine each, judged like the grid
(row check + output check). Writes scaled-head.json next to this file's --out.

    PYTHONPATH=$PWD /work/wt/engine-run .venv/bin/python outputs/cpu/constraints-0.32.0/scaled_head.py OUT_DIR eagle ngram
"""
import json
import os
import sys

from workbook.core import contracts
from workbook.run import constraints as C
from workbook.run import grid as G
from workbook.run import request as rq
from workbook.vllm import engine as vengine

out, methods = sys.argv[1], sys.argv[2:]
res = {}
for m in methods:
    eng = vengine.start(G.config_for(m))
    try:
        with rq.scaled_lm_head(eng, 1e5):
            sp = C.sampling_params({})
            base = [int(t) for t in eng.llm.generate(
                [{"prompt_token_ids": C.prompt_for(eng.tokenizer, "nothing")}], sp,
                use_tqdm=False)[0].outputs[0].token_ids]
            cases = {c: C.case_kwargs(c, base, eng.tokenizer.decode) for c in contracts.CONSTRAINTS
                     if c != "logit_bias"}  # refused with spec decoding (0.32)
            cells, _ = C.run_batch(eng, cases, zero_head=False, batch="mixed-scaled")
        res[m] = {c: {k: v for k, v in cl.to_dict().items() if k != "output"}
                  for c, cl in cells.items()}
        for c, cl in cells.items():
            print(m, c, cl.status, cl.rows, cl.draft_rows, cl.accepted_drafts, cl.first,
                  cl.message[:200], flush=True)
    finally:
        eng.shutdown()
import vllm  # noqa: E402

os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "scaled-head.json"), "w") as f:
    json.dump({"vllm_version": vllm.__version__, "batch": "mixed-scaled", "factor": 1e5,
               "methods": res}, f, indent=1, default=str)
