#!/usr/bin/env bash
# Issue #27, overruns: ONE device call (H100/H200, torch 2.11, CUDA 13 toolkit with
# compute-sanitizer; vLLM 0.29 from the offline bundle in .bundle/). From the repository root:
#
#   bash scripts/gpu_redzone.sh            # at most ~190 s: everything under $OUT
#
# Three watched start-ups of the tiny Qwen3.5 + MTP k=4 (environments/h200.yaml defaults, eager),
# at the same time on the one GPU (each with a quarter of its memory), each under
# compute-sanitizer memcheck with the markers and their red zones read-only (NVTX permissions;
# workbook.hooks.watch.redzone, WORKBOOK_REDZONE bytes each side, default 256):
#   overrun-caching-on / overrun-caching-off  the overrun writer (workbook.hooks.watch.writers
#       'overrun': the user module's Triton kernel fill_ids on a span from WORKBOOK_OVERRUN_BYTES
#       (default 1024) below the marker through its last byte) in the drafter's propose during
#       the profiling run, PyTorch's caching allocator on / off
#       (python -m workbook.run.writer.command --probe overrun);
#   healthy-caching-on  no writer: `workbook watch --sanitize nvtx` (no false alarm from the red
#       zones; what vLLM samples unchanged: checks A and B).
# The overrun runs are cut at LIMIT_S seconds (default 150; the writer strikes in the profiling
# run), the healthy one at HEALTHY_S (default 170: it must get through warm-up into real steps;
# a cut start-up reads "incomplete", never "intact"). CUPTI's watcher is off
# (WORKBOOK_API_WRITES=0: beside compute-sanitizer it has never been tried; not this call's
# question). Then the layout comparison of the two overrun runs (integrity.layout_ab).
# Results: $OUT/redzone-gpu.txt (one line per run: the named writer and its range; the reading),
# $OUT/<run>/{watch-summary.json,writer.json,sanitizer.json,watch.json,modules.json,pass.log,
# sanitizer-head.log} and $OUT/redzone-gpu.tgz (every run folder, whole sanitizer logs).
# CPU dry run of the script's own plumbing: DRY=1 bash scripts/gpu_redzone.sh (no engine).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu-redzone-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/gpu-redzone}; mkdir -p "$WORK"
SUM="$OUT/redzone-gpu.txt"
PY=${PYTHON:-python3}
LIMIT=${LIMIT_S:-150}
HEALTHY=${HEALTHY_S:-170}
say() { echo "$*" | tee -a "$SUM"; }
if [ -z "${DRY:-}" ] && ! "$PY" -c "import vllm" 2>/dev/null; then
  [ -f .bundle/install.sh ] || { say "no vLLM and no .bundle/install.sh (carry .bundle)"; exit 2; }
  eval "$(bash .bundle/install.sh .bundle)" || { say "bundle install failed"; exit 2; }
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WORKBOOK_CACHE=${WORKBOOK_CACHE:-/tmp/workbook-cache} VLLM_TRITON_FORCE_FIRST_CONFIG=1
export COMPUTE_SANITIZER=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} VLLM_USE_FLASHINFER_SAMPLER=0
export WORKBOOK_REDZONE=${WORKBOOK_REDZONE:-256} WORKBOOK_OVERRUN_BYTES=${WORKBOOK_OVERRUN_BYTES:-1024}
export WORKBOOK_API_WRITES=${WORKBOOK_API_WRITES:-0}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$COMPUTE_SANITIZER" --version 2>&1 | tail -1
  "$PY" -c "import torch; print('torch', torch.__version__)"
  [ -z "${DRY:-}" ] && "$PY" -c "import vllm; print('vllm', vllm.__version__)"
  echo "red zone ${WORKBOOK_REDZONE} bytes each side; overrun span from ${WORKBOOK_OVERRUN_BYTES} bytes below"
} >> "$SUM" 2>&1
"$PY" -c "from workbook.core import models; print(models.build('tiny-qwen3.5-mtp'))" >> "$SUM" 2>&1
COMMON=(--env h200 --set max_tokens=4 --set gpu_memory_utilization=0.25)
run_probe() {  # name caching
  local t0; t0=$(date +%s)
  timeout -s INT "$LIMIT" "$PY" -m workbook.run.writer.command --probe overrun --caching "$2" \
    --sanitize nvtx --out "$WORK/$1" --timeout "$((LIMIT - 10))" "${COMMON[@]}" \
    > "$WORK/$1.log" 2>&1
  echo "$1 rc=$? $(( $(date +%s) - t0 ))s" > "$WORK/$1.rc"
}
run_healthy() {
  local t0; t0=$(date +%s)
  timeout -s INT "$HEALTHY" "$PY" -m workbook.cli watch --sanitize nvtx --localize none \
    --caching on --out "$WORK/healthy-caching-on" --timeout "$((HEALTHY - 10))" "${COMMON[@]}" \
    > "$WORK/healthy-caching-on.log" 2>&1
  echo "healthy-caching-on rc=$? $(( $(date +%s) - t0 ))s" > "$WORK/healthy-caching-on.rc"
}
if [ -z "${DRY:-}" ]; then
  run_healthy &
  run_probe overrun-caching-on on &
  run_probe overrun-caching-off off &
  wait
fi
for n in overrun-caching-on overrun-caching-off healthy-caching-on; do
  [ -f "$WORK/$n.rc" ] && cat "$WORK/$n.rc" >> "$SUM"
  line=$(grep -E "^PROBE " "$WORK/$n.log" 2>/dev/null | tail -1)
  log="$WORK/$n/pass1-none/sanitizer.log"
  if [ -z "$line" ] && [ -f "$log" ]; then  # cut off: read what memcheck wrote
    line="(cut) $("$PY" -m workbook.run.writer.sanitizer "$log" --watch "$WORK/$n/pass1-none/watch/watch.json" \
      -o "$WORK/$n/sanitizer-partial.json" 2>&1 | tail -1)"
  fi
  [ -z "$line" ] && line=$(grep -E -A1 '^(== culprit|sanitizer stage|FIRST WRITER)' "$WORK/$n.log" 2>/dev/null | head -6 | tr '\n' ' ')
  say "$n: ${line:-no result line (see $n/run.log)}"
  mkdir -p "$OUT/$n"
  for f in watch-summary.json sanitizer-partial.json pass1-none/writer.json pass1-none/sanitizer.json \
           pass1-none/watch/watch.json pass1-none/watch/modules.json \
           pass1-none/pass.log pass1-none/verdict.json; do
    [ -f "$WORK/$n/$f" ] && cp "$WORK/$n/$f" "$OUT/$n/"
  done
  [ -f "$WORK/$n.log" ] && tail -c 200000 "$WORK/$n.log" > "$OUT/$n/run.log"
  [ -f "$log" ] && head -c 2000000 "$log" > "$OUT/$n/sanitizer-head.log" \
    && echo "  memcheck: $(grep -c 'Invalid __global__' "$log") access records, $(grep -E 'ERROR SUMMARY' "$log" | tail -1)" | tee -a "$SUM"
done
"$PY" - "$WORK" >> "$SUM" 2>&1 <<'PYEOF'
import json, os, sys
from workbook.run import integrity
root = sys.argv[1]
def summ(n):
    p = os.path.join(root, n, "watch-summary.json")
    return json.load(open(p)) if os.path.exists(p) else None
on, off = summ("overrun-caching-on"), summ("overrun-caching-off")
print("A/B tiny overrun: " + integrity.layout_ab(on, off)["reading"])
for n in ("overrun-caching-on", "overrun-caching-off"):
    p = os.path.join(root, n, "pass1-none", "sanitizer.json")
    if os.path.exists(p):
        ex = json.load(open(p)).get("extent")
        print(f"extent {n}: " + (ex["sentence"] if ex else "no launch touched watched memory"))
    p = os.path.join(root, n, "pass1-none", "watch", "watch.json")
    if os.path.exists(p):
        w = json.load(open(p))
        z = ((w.get("protection") or {}).get("redzones") or {})
        print(f"red zones {n}: " + json.dumps(z.get("zones") if z else w.get("protection", {}).get("redzones")))
PYEOF
tar czf "$OUT/redzone-gpu.tgz" -C "$WORK" . 2>/dev/null
say "total $(( $(date +%s) - T0 ))s"
exit 0
