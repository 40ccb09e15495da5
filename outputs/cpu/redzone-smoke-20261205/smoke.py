"""CPU smoke: the red zones on a real engine change nothing vLLM computes (sanitize=nvtx with no
tool attached: every permission call a no-op, the markers moved into padded buffers)."""
import json, os, sys
mode = sys.argv[1]; out = sys.argv[2]
if mode == "nvtx":
    os.environ["WORKBOOK_UNDER_SANITIZER"] = "1"
from workbook.core.config import RunConfig
from workbook.vllm import env as wb_env
cfg = RunConfig(watch=True, sanitize=mode, max_tokens=12, thinking_token_budget=3, cpu_profile_run=True)
wb_env.prepare_process(cfg)
from workbook.run import pipeline
r = pipeline.run(cfg, out, checks=["A"])
w = json.load(open(os.path.join(out, "watch", "watch.json"))) if os.path.exists(os.path.join(out, "watch", "watch.json")) else json.load(open(os.path.join(out, "watch.json")))
print("RESULT", mode, json.dumps({"honored": r.outcome.honored, "tokens": getattr(r.outcome, "token_ids", None) or getattr(r.outcome, "output_token_ids", None),
      "protection_mode": w["protection"].get("mode"), "redzones": (w["protection"].get("redzones") or {}).get("markers") if isinstance(w["protection"].get("redzones"), dict) else w["protection"].get("redzones"),
      "layout_zoned": [t["name"] for t in w["layout"] if t.get("redzone")], "first_change": w.get("first_change"), "real_steps": w["steps"]["real_steps"]}, default=str))
