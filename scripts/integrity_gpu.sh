#!/usr/bin/env bash
# Issue #13 on the borrowed H200 (vLLM 0.29.0 offline bundle, no network):
#   eval "$(bash .bundle/install.sh .bundle)" && bash scripts/integrity_gpu.sh
# Steps (STEPS="..." picks a subset, in this order):
#   faults     workbook watch --env h200 --run R --localize auto for the healthy start-up and each
#              H-i fault (the watch names phase, module, op), then the guard variants (checks A/B)
#   bench      benchmarks/watch_overhead.py: per-step cost of the watch, side by side in one run
#   sanitizer  scripts/integrity_sanitizer.sh on a healthy and a faulted start-up (memcheck,
#              PYTORCH_NO_CUDA_MEMORY_CACHING=1), the report tied to the watched addresses
#   shape27b   workbook watch --localize auto on the reporter-shaped Qwen3.5 + MTP
#              (workbook.core.reporter_models: qwen3.5-27b-shape, dummy weights) with
#              H-i-profile-mtp: the localization's wall time
# Everything lands in $OUT (default /tmp/integrity-out: on the device tool, its own $OUT);
# one line per result on stdout, the details in $OUT/<run>/ (watch-summary.json, pass*/).
set -uo pipefail
OUT=${OUT:-/tmp/integrity-out}; mkdir -p "$OUT"
STEPS=${STEPS:-faults bench sanitizer shape27b}
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WORKBOOK_CACHE=/tmp/workbook-cache
export VLLM_TRITON_FORCE_FIRST_CONFIG=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
summary() { "$PY" - "$1" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
c = s["culprit"]
p = s["passes"]
print(f"  culprit: {c.get('verdict')} {c.get('hypothesis')} | phase {c.get('phase')} | module "
      f"{c.get('module')} | op {c.get('op')} | passes {[x['seconds'] for x in p]} s | "
      f"budget {[x.get('budget_verdict') for x in p]} | checks {[x.get('checks') for x in p]}")
PYEOF
}
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
  faults)
    for run in watch-mtp fault-H-i-profile fault-H-i-profile-no-spec fault-H-i-profile-mtp \
               fault-H-i-step; do
      timeout -s INT 900 "$PY" -m workbook.cli watch --env h200 --run $run --localize auto \
        --out "$OUT/$run" > "$OUT/$run.log" 2>&1
      echo "$run rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/$run/watch-summary.json"
    done
    for run in watch-mtp-cudagraphs fault-H-i-profile-guard fault-H-i-profile-no-spec-guard \
               fault-H-i-profile-mtp-guard fault-H-i-step-guard; do
      timeout -s INT 600 "$PY" -m workbook.cli watch --env h200 --run $run --localize none \
        --out "$OUT/$run" > "$OUT/$run.log" 2>&1
      echo "$run rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/$run/watch-summary.json"
    done ;;
  bench)
    timeout -s INT 600 "$PY" benchmarks/watch_overhead.py --model tiny-qwen3.5-mtp \
      --set kv_cache_bytes=1073741824 --set "engine_kwargs={gdn_prefill_backend: triton}" \
      --num-reqs 8 --max-tokens 64 --rounds 6 --json "$OUT/watch_overhead.json" \
      > "$OUT/watch_overhead.log" 2>&1
    echo "bench rc=$?"; grep -E "^step time" "$OUT/watch_overhead.log" ;;
  sanitizer)
    for run in watch-mtp fault-H-i-profile-mtp; do
      PYTHON="$PY" SANITIZER_TIMEOUT=900 bash scripts/integrity_sanitizer.sh "$OUT/sanitizer-$run" \
        --env h200 --run $run --set max_tokens=8 > "$OUT/sanitizer-$run.log" 2>&1
      echo "sanitizer $run rc=$? $(( $(date +%s) - t0 )) s"; tail -n 3 "$OUT/sanitizer-$run.log"
    done ;;
  shape27b)
    timeout -s INT 900 "$PY" -m workbook.cli watch --localize auto --out "$OUT/shape27b" \
      --env h200 --run r27-mtp-eager --set fault=H-i-profile-mtp --set max_tokens=8 \
      > "$OUT/shape27b.log" 2>&1
    echo "shape27b rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/shape27b/watch-summary.json" ;;
  esac
done
echo "$OUT"
