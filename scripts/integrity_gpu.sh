#!/usr/bin/env bash
# Issue #13 on the borrowed H200 (vLLM 0.29.0 offline bundle, no network):
#   eval "$(bash .bundle/install.sh .bundle)" && bash scripts/integrity_gpu.sh
# Steps (STEPS="..." picks a subset, in this order):
#   faults     workbook watch --env h200 --run R --localize auto for the healthy start-up and each
#              H-i fault (the watch names phase, module, op), then the guard variants (checks A/B)
#   bench      benchmarks/step_overhead.py --watch --sync-check on BENCH_RUN (default mtp-cudagraphs):
#              per-step cost of the watch, the tracer and the guard side by side in one engine,
#              and the synchronizations each adds per step
#   sanitizer  scripts/integrity_sanitizer.sh on a healthy and a faulted start-up (memcheck,
#              PYTORCH_NO_CUDA_MEMORY_CACHING=1), the report tied to the watched addresses
#   shape27b   workbook watch --localize auto on the reporter-shaped Qwen3.5 + MTP
#              (workbook.core.reporter_models: qwen3.5-27b-shape, dummy weights) with
#              H-i-profile-mtp: the localization's wall time
# Subsets (the device tool allows 10 minutes per command): FAULT_RUNS, GUARD_RUNS, SANITIZER_RUNS
# (run names of environments/h200.yaml), RUN_S (seconds per run, default 300).
# Everything lands in $OUT (default /tmp/integrity-out: on the device tool, its own $OUT);
# one line per result on stdout, the details in $OUT/<run>/ (watch-summary.json, pass*/).
set -uo pipefail
OUT=${OUT:-/tmp/integrity-out}; mkdir -p "$OUT"
STEPS=${STEPS:-faults bench sanitizer shape27b}
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WORKBOOK_CACHE=${WORKBOOK_CACHE:-/tmp/workbook-cache}  # one per concurrent call
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
    for run in ${FAULT_RUNS:-watch-mtp fault-H-i-profile fault-H-i-profile-no-spec \
               fault-H-i-profile-mtp fault-H-i-step}; do
      timeout -s INT "${RUN_S:-300}" "$PY" -m workbook.cli watch --env h200 --run $run --localize auto \
        --out "$OUT/$run" > "$OUT/$run.log" 2>&1
      echo "$run rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/$run/watch-summary.json"
    done
    for run in ${GUARD_RUNS:-watch-mtp-cudagraphs fault-H-i-profile-guard \
               fault-H-i-profile-no-spec-guard fault-H-i-profile-mtp-guard fault-H-i-step-guard}; do
      timeout -s INT "${RUN_S:-300}" "$PY" -m workbook.cli watch --env h200 --run $run --localize none \
        --out "$OUT/$run" > "$OUT/$run.log" 2>&1
      echo "$run rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/$run/watch-summary.json"
    done ;;
  bench)
    timeout -s INT "${RUN_S:-300}" "$PY" benchmarks/step_overhead.py --env h200 \
      --run "${BENCH_RUN:-mtp-cudagraphs}" --watch --sync-check --batch 4 --max-tokens 32 \
      --rounds 5 --json-out "$OUT/step_overhead.json" > "$OUT/step_overhead.log" 2>&1
    echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "ms/step" "$OUT/step_overhead.log" ;;
  sanitizer)
    for run in ${SANITIZER_RUNS:-watch-mtp fault-H-i-profile-mtp}; do
      PYTHON="$PY" SANITIZER_TIMEOUT="${RUN_S:-500}" bash scripts/integrity_sanitizer.sh "$OUT/sanitizer-$run" \
        --env h200 --run $run --set max_tokens=8 > "$OUT/sanitizer-$run.log" 2>&1
      echo "sanitizer $run rc=$? $(( $(date +%s) - t0 )) s"; tail -n 3 "$OUT/sanitizer-$run.log"
    done ;;
  shape27b)
    timeout -s INT "${RUN_S:-560}" "$PY" -m workbook.cli watch --localize auto --out "$OUT/shape27b" \
      --env h200 --run r27-integrity > "$OUT/shape27b.log" 2>&1
    echo "shape27b rc=$? $(( $(date +%s) - t0 )) s"; summary "$OUT/shape27b/watch-summary.json" ;;
  esac
done
echo "$OUT"
