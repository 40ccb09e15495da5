#!/usr/bin/env bash
# One borrowed-H200 call for the reporter's shape: every hook's cost per step side by side on
# the 27B-shaped engine with CUDA graphs (benchmarks/step_overhead.py), then the r27 runs of
# environments/h200.yaml on that same engine, then the tiny Qwen3.5 + MTP with FlashInfer
# attention end to end (the reporter's "Fused multi-step draft decode ... FLASHINFER" fallback).
#   eval "$(bash .bundle/install.sh .bundle)" && eval "$(bash .bundle/install-flashinfer.sh .bundle)" \
#     && bash scripts/gpu_final.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WORKBOOK_CACHE=/tmp/workbook-cache
export VLLM_TRITON_FORCE_FIRST_CONFIG=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
VLLM_USE_FLASHINFER_SAMPLER=0 timeout -s INT "${BENCH_S:-330}" python3 benchmarks/step_overhead.py \
  --env h200 --run r27-mtp-cudagraphs --batch 4 --max-tokens 32 --rounds 5 \
  --matrix ${MATRIX:-r27-mtp-cudagraphs r27-fault-H-a r27-fault-H-a-guard} --out /tmp/wb-outputs \
  --json-out "$OUT/step_overhead_r27.json" > /tmp/bench.log 2>&1
echo "r27 bench+matrix rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "ms/step|^matrix|^r27-[a-zA-Z0-9-]+: " /tmp/bench.log
t0=$(date +%s)
timeout -s INT "${FI_S:-220}" python3 -m workbook.cli run h200 --in-process --no-report \
  --no-progress --out /tmp/wb-outputs --only mtp-eager --set attention_backend=FLASHINFER \
  > /tmp/fi.log 2>&1
echo "tiny FlashInfer rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^mtp-eager: |Fused multi-step|Using FlashInfer|FLASHINFER backend" /tmp/fi.log | head
tar czf "$OUT/h200-outputs.tgz" -C /tmp/wb-outputs . 2>/dev/null
grep -v "^DEBUG\|force_first_config" /tmp/bench.log /tmp/fi.log | tail -c 3000000 > "$OUT/logs.txt"
exit 0
