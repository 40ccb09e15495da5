#!/usr/bin/env bash
# On the borrowed H200 (no vLLM, no network): the h200 matrix in one process, then the tracer
# and guard benchmarks. Everything lands in $OUT (outputs as one tarball: $OUT keeps 2 levels).
#   eval "$(bash .bundle/install.sh .bundle)" && bash scripts/gpu_evidence.sh
# Env: ONLY="run names" (subset of environments/h200.yaml), MATRIX_S / BENCH_S (time limits).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WORKBOOK_CACHE=/tmp/workbook-cache
export VLLM_TRITON_FORCE_FIRST_CONFIG=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout -s INT "${MATRIX_S:-330}" python3 -m workbook.cli run h200 --in-process --no-report \
  --no-progress --out /tmp/wb-outputs ${ONLY:+--only $ONLY} > "$OUT/matrix.log" 2>&1
echo "matrix rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "^[a-z0-9-]+: (ok|failed)" "$OUT/matrix.log"
tar czf "$OUT/h200-outputs.tgz" -C /tmp/wb-outputs . 2>/dev/null
MODEL=(--model tiny-qwen3.5-mtp --kv-cache-bytes 1073741824 --engine-kwargs '{"gdn_prefill_backend": "triton"}')
t0=$(date +%s)
timeout -s INT "${BENCH_S:-110}" python3 benchmarks/trace_overhead.py "${MODEL[@]}" --reps 5 \
  --json-out "$OUT/trace_bench.json" > "$OUT/trace_bench.log" 2>&1
echo "trace bench rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "steps/generate" "$OUT/trace_bench.log"
t0=$(date +%s)
timeout -s INT "${BENCH_S:-110}" python3 benchmarks/guard_overhead.py --num-reqs 8 --max-tokens 64 \
  --rounds 6 --json "$OUT/guard_bench.json" > "$OUT/guard_bench.log" 2>&1
echo "guard bench rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "^SUMMARY" "$OUT/guard_bench.log"
exit 0
