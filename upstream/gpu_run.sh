#!/usr/bin/env bash
# On the borrowed H200 host (no vLLM, no network): vLLM 0.29.0 from the offline bundle
# (shared/gpu), compiled Triton. Stages (STAGES="upstream guard e2e bench", default all):
#   upstream  upstream/vllm-0.29.0.diff applied to a copy of the bundle's vllm, unit test
#   guard     tests/test_guard.py (kernel vs vLLM's kernel on CUDA, patch identity, broken vLLM
#             with MTP k=4, healthy identity for mtp)
#   e2e       upstream/e2e_check.py on the patched copy (real engine, vLLM's forcing broken)
#   bench     benchmarks/guard_overhead.py (random weights, and --accept-drafts)
# Writes logs and JSON to $OUT. Needs .bundle/ (install.sh + part) and .gpu_py/ (pytest).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
STAGES=${STAGES:-"upstream guard e2e bench"}
eval "$(bash .bundle/install.sh .bundle)" || { echo "bundle install failed"; exit 2; }
export PYTHONPATH="$PYTHONPATH:$PWD/.gpu_py:$PWD"
export VLLM_TRITON_FORCE_FIRST_CONFIG=1 WORKBOOK_CACHE=/tmp/workbook-cache
PY=python3
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
for stage in $STAGES; do
  t0=$(date +%s)
  case $stage in
    upstream)
      rm -rf /tmp/up && mkdir -p /tmp/up && cp -a /tmp/vllm-site/vllm /tmp/up/vllm
      (cd /tmp/up && patch -p1 --forward --no-backup-if-mismatch < "$OLDPWD/upstream/vllm-0.29.0.diff") > "$OUT/upstream.log" 2>&1
      (cd /tmp/up && PYTHONPATH="/tmp/up:$PYTHONPATH" timeout 400 $PY -m pytest -q -p no:cacheprovider \
         tests/v1/worker/gpu/sample/test_thinking_budget_guard.py --rootdir /tmp/up) >> "$OUT/upstream.log" 2>&1
      echo "upstream rc=$?" | tee -a "$OUT/upstream.log"; tail -3 "$OUT/upstream.log" ;;
    guard)
      timeout 500 $PY -m pytest -q -p no:cacheprovider tests/test_guard.py --durations=15 \
        -k "kernel or count or remove or broken or hypothesis or reinstall or identity_on_healthy_vllm[mtp]" > "$OUT/guard.log" 2>&1
      echo "guard rc=$?" | tee -a "$OUT/guard.log"; grep -E "passed|failed|error" "$OUT/guard.log" | tail -3 ;;
    e2e)
      PYTHONPATH="/tmp/up:$PYTHONPATH" timeout 300 $PY upstream/e2e_check.py > "$OUT/e2e.log" 2>&1
      echo "e2e rc=$?" | tee -a "$OUT/e2e.log"; grep -E "^E2E |Error" "$OUT/e2e.log" | tail -3 ;;
    bench)
      timeout 250 $PY benchmarks/guard_overhead.py --num-reqs 8 --max-tokens 64 --rounds 6 \
        --json "$OUT/bench_random.json" > "$OUT/bench_random.log" 2>&1
      echo "bench rc=$?"; grep -E "^SUMMARY" "$OUT/bench_random.log"
      timeout 250 $PY benchmarks/guard_overhead.py --num-reqs 8 --max-tokens 64 --rounds 6 \
        --accept-drafts --json "$OUT/bench_accept.json" > "$OUT/bench_accept.log" 2>&1
      echo "bench-accept rc=$?"; grep -E "^SUMMARY" "$OUT/bench_accept.log" ;;
  esac
  echo "== $stage took $(( $(date +%s) - t0 )) s"
done
