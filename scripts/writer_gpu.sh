#!/usr/bin/env bash
# Issue #19 on the borrowed H200: name the writer of ThinkingBudgetState's markers by kernel and
# Python frame (NVTX memory permissions under compute-sanitizer memcheck), per writer kind and
# caching-allocator layout, and the watch's per-step cost. From the repository root, with
# .bundle/ (vLLM 0.29.0 bundle; for r27 also FlashInfer: scripts/fetch_flashinfer.sh) carried:
#
#   STEPS=tiny      bash scripts/writer_gpu.sh     # call 1 (~8-9 min)
#   STEPS="r27 bench" bash scripts/writer_gpu.sh   # call 2 (~9-10 min)
#
# Steps (STEPS, in this order; default "tiny"):
#   tiny   for each KIND (alias_fill memset triton_store) x CACHING (off on): one watched start-up
#          of the tiny Qwen3.5 + MTP k=4 (environments/h200.yaml defaults, eager) under
#          compute-sanitizer, the markers read-only through NVTX, a writer of KIND hidden in the
#          drafter's propose during the profiling run (python -m workbook.run.writer.command --probe;
#          workbook.hooks.watch.writers); caching off: each tensor its own cudaMalloc; on: the marker
#          segment registered as an NVTX heap, every block a region. Limit FIRST_S (the first
#          run KINDS x CACHING select: Triton's cold compile under memcheck; default 170) then
#          RUN_S (default 90) seconds per run (all six: up to 620 s, past one 600 s device call:
#          split with CACHING=off / CACHING=on). A run cut before start-up ends reads
#          "incomplete", never "intact".
#   r27    the same at the reporter's shape: r27-nvfp4-mtp-flashinfer (Qwen3.5 27B-shape NVFP4,
#          FlashInfer attention, MTP k=4) for R27_KINDS (default alias_fill) x R27_CACHING
#          (default on), R27_S seconds each (default 300; gpu_memory_utilization R27_GPU_UTIL,
#          default 0.6: memcheck needs room of its own; the record is written when the
#          profiling run's drafter writes, so a run cut short later still names it).
#          KINDS entries may be KIND@N (write in real step N: --writer-step N); kind triton_user
#          is a user's Triton kernel through its wrapper (tests/data/user_kernels.py). R27_LAYERS=N:
#          N decoder layers of the same shape (hf_overrides); SANITIZE=none: the same pass without
#          memcheck (the watch's memory per phase for comparison); R27_SET: more --set KEY=VALUE.
#   bench  benchmarks/step_overhead.py --watch --arms BENCH_ARMS (default none,watch; the row
#          check is the arm "constraints") on BENCH_RUN (default
#          r27-mtp-cudagraphs, batch 4, k=4, CUDA graphs): the watch's ratio after start-up
#          (ring_stride 4), BENCH_S seconds (default 230).
# Results: $OUT/writer-gpu.txt (one line per run: what was named) and $OUT/writer-gpu.tgz (every
# run folder: watch-summary.json, pass1-none/{sanitizer.log,sanitizer.json,writer.json,watch/
# watch.json,pass.log}), re-packed after every run so a cut-off call still returns them.
# Commit the unpacked folders under outputs/h200/writer/.
set -uo pipefail
OUT=${OUT:-/tmp/writer-gpu-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/writer-gpu}; mkdir -p "$WORK"
STEPS=${STEPS:-tiny}
SUM="$OUT/writer-gpu.txt"
PY=${PYTHON:-python3}
WB_ENV=${WB_ENV:-h200}  # CPU dry run: WB_ENV=cpu PYTHON=.venv/bin/python PROBE_ARGS="--set cpu_profile_run=true"
if ! "$PY" -c "import vllm" 2>/dev/null; then
  [ -f .bundle/install.sh ] || { echo "no vLLM and no .bundle/install.sh (carry .bundle)" | tee -a "$SUM"; exit 2; }
  eval "$(bash .bundle/install.sh .bundle)"
fi
if [ -f .bundle/install-flashinfer.sh ] && ! "$PY" -c "import flashinfer" 2>/dev/null; then
  eval "$(bash .bundle/install-flashinfer.sh .bundle)" || echo "FlashInfer install failed" | tee -a "$SUM"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WORKBOOK_CACHE=${WORKBOOK_CACHE:-/tmp/workbook-cache} VLLM_TRITON_FORCE_FIRST_CONFIG=1
export COMPUTE_SANITIZER=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
pack() { tar czf "$OUT/writer-gpu.tgz.tmp" -C "$WORK" . 2>/dev/null && mv "$OUT/writer-gpu.tgz.tmp" "$OUT/writer-gpu.tgz"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$COMPUTE_SANITIZER" --version 2>&1 | tail -1; g++ --version | head -1
  ls "$CUDA_HOME/include/nvtx3/nvToolsExtMem.h" "$CUDA_HOME/include/nvtx3/nvToolsExtMemCudaRt.h"
  "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
} >> "$SUM" 2>&1
probe() {  # name limit kind[@step] caching [watchcmd args...]
  local name=$1 limit=$2 kind=${3%@*} caching=$4 stepargs=()
  [ "$3" != "$kind" ] && stepargs=(--writer-step "${3#*@}")
  shift 4
  local t0=$(date +%s)
  timeout -s INT "$limit" "$PY" -m workbook.run.writer.command --probe "$kind" "${stepargs[@]}" --caching "$caching" \
    --sanitize "${SANITIZE:-nvtx}" --out "$WORK/$name" --timeout "$((limit - 10))" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local line; line=$(grep -E "^PROBE " "$WORK/$name.log" | tail -1)
  if [ -z "$line" ] && [ -f "$WORK/$name/pass1-none/sanitizer.log" ]; then  # cut off: parse what memcheck wrote
    line="PROBE $kind caching=$caching (cut at ${limit}s): $("$PY" -m workbook.run.writer.sanitizer \
      "$WORK/$name/pass1-none/sanitizer.log" --watch "$WORK/$name/pass1-none/watch/watch.json" \
      -o "$WORK/$name/sanitizer-partial.json" 2>&1 | tail -1)"
  fi
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s ${line:-no PROBE line (see $name.log)}" | tee -a "$SUM"
  pack
}
for step in $STEPS; do
  case $step in
  tiny)
    first=1
    for caching in ${CACHING:-off on}; do
      for kind in ${KINDS:-alias_fill memset triton_store}; do
        lim=${RUN_S:-90}; [ $first = 1 ] && lim=${FIRST_S:-170}; first=0
        probe "tiny-${kind/@/-step}-caching-$caching" "$lim" "$kind" "$caching" --env "$WB_ENV" --set max_tokens=${TINY_TOKENS:-4} ${PROBE_ARGS:-}
      done
    done ;;
  r27)
    # R27_LAYERS (e.g. 8): that many decoder layers of the same shape ([linear x3, full] per 4:
    # every kernel kind the 64 have) through hf_overrides; R27_SET: more --set KEY=VALUE;
    # SANITIZE=none: the same start-up watched without memcheck (its memory per phase)
    r27set=()
    if [ -n "${R27_LAYERS:-}" ]; then
      lt=$("$PY" -c "import json,sys; n=int(sys.argv[1]); print(json.dumps((['linear_attention']*3+['full_attention'])*(n//4)))" "$R27_LAYERS")
      r27set=(--set "engine_kwargs={\"gdn_prefill_backend\": \"triton\", \"enable_flashinfer_autotune\": false, \"hf_overrides\": {\"text_config\": {\"num_hidden_layers\": $R27_LAYERS, \"layer_types\": $lt}}}")
    fi
    for caching in ${R27_CACHING:-on}; do
      for kind in ${R27_KINDS:-alias_fill}; do
        VLLM_USE_FLASHINFER_SAMPLER=0 probe "r27${R27_LAYERS:+-${R27_LAYERS}L}-${SANITIZE:-nvtx}-$kind-caching-$caching" "${R27_S:-300}" "$kind" \
          "$caching" --env "$WB_ENV" --run r27-nvfp4-mtp-flashinfer --set max_tokens=4 \
          --set gpu_memory_utilization=${R27_GPU_UTIL:-0.6} "${r27set[@]}" ${R27_SET:-}
      done
    done ;;
  bench)
    t0=$(date +%s)
    VLLM_USE_FLASHINFER_SAMPLER=0 timeout -s INT "${BENCH_S:-230}" "$PY" benchmarks/step_overhead.py \
      --env "$WB_ENV" --run "${BENCH_RUN:-r27-mtp-cudagraphs}" --watch --arms "${BENCH_ARMS:-none,watch}" --batch 4 \
      --max-tokens 32 --rounds "${BENCH_ROUNDS:-3}" --json-out "$WORK/step_overhead.json" \
      > "$WORK/step_overhead.log" 2>&1
    echo "bench rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$SUM"
    grep -E "ms/step" "$WORK/step_overhead.log" | tee -a "$SUM"
    pack ;;
  esac
done
"$PY" - "$WORK" >> "$SUM" 2>&1 <<'PYEOF'
import glob, json, os, sys
from workbook.run import integrity
root = sys.argv[1]
def summ(p):
    return json.load(open(p)) if os.path.exists(p) else None
for d in sorted(glob.glob(f"{root}/*/pass1-none/watch/watch.json")):
    w = json.load(open(d))
    mem = [(p["phase"], p.get("memory")) for p in w.get("phases") or [] if p.get("memory")]
    if mem:
        print("memory " + d.split("/")[-4] + ": " + "; ".join(
            f"{ph}: alloc {m.get('allocated_gib')} peak {m.get('peak_allocated_gib')} "
            f"free {m.get('free_gib')} outside-pytorch {m.get('outside_pytorch_gib')} GiB"
            for ph, m in mem))
for shape in ("tiny", "r27"):
    for kind in ("alias_fill", "memset", "triton_store", "triton_user"):
        on = summ(f"{root}/{shape}-{kind}-caching-on/watch-summary.json")
        off = summ(f"{root}/{shape}-{kind}-caching-off/watch-summary.json")
        if on or off:
            print(f"A/B {shape} {kind}: {integrity.layout_ab(on, off)['reading']}")
PYEOF
pack
echo "$OUT"
