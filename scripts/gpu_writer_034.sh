#!/usr/bin/env bash
# Issue 40 on one GPU (H100 / H200), vLLM 0.34.0 from the offline bundle (+ FlashInfer 0.6.18):
# the hooks' cost at the reporter's shape with CUDA graphs (greedy and sampled with a seed) and a
# bare `--sanitize` (the auto plan: memcheck + NVTX permissions, then the CUDA API pass) at the
# 27B NVFP4 + FlashInfer shape (8 decoder layers) on writer kinds a user's code or a library can
# be. From the repository root, with .bundle/ carried (install.sh + parts, install-flashinfer.sh
# + part), one call per STEPS value, each within WALL_S seconds (default 530, under 9 minutes):
#
#   STEPS="bench warm"                  bash scripts/gpu_writer_034.sh   # call 1
#   STEPS=r27 KINDS="alias_fill copy"   bash scripts/gpu_writer_034.sh   # call 2
#   STEPS=r27 KINDS="triton_store memset" bash scripts/gpu_writer_034.sh # call 3
#   STEPS=r27 KINDS="overrun"           bash scripts/gpu_writer_034.sh   # call 4
#
# Steps (STEPS, in order; each in its own process under its own `timeout`, cut to the wall left):
#   bench  benchmarks/step_overhead.py --env h200 --run BENCH_RUN (default r27-mtp-cudagraphs:
#          Qwen3.5 27B shape bf16, MTP k=4, batch 4, CUDA graphs) --watch --arms BENCH_ARMS
#          (default none,guard,trace,rowcheck,watch), greedy and {"temperature": 0.8, "seed": 1}
#          on the same engine, every arm interleaved (ratios side by side), BENCH_ROUNDS rounds
#          (default 3); limit BENCH_S (default 480).
#   warm   the r27 start-up below watched without sanitizer or writer (`workbook watch
#          --localize none`): FlashInfer's JIT cache filled before the memcheck passes, and the
#          healthy 27B shape on 0.34 (INTACT expected); limit WARM_S (default 330).
#   r27    for each KIND of KINDS (alias_fill: PyTorch fill_ on an alias; triton_store: a Triton
#          kernel; copy: copy_ -> cudaMemcpyAsync; memset: cudaMemsetAsync; overrun: a user's
#          Triton kernel from WORKBOOK_OVERRUN_BYTES (default 6000: past the 4 KiB red zone) below
#          the marker into it;
#          KIND@N writes in real step N): `python -m workbook.run.writer.command --probe KIND
#          --sanitize auto` (what a bare `workbook watch --sanitize` runs) on R27_RUN (default
#          r27-nvfp4-mtp-flashinfer) with R27_LAYERS (default 8) decoder layers, caching
#          allocator CACHING (default on), gpu_memory_utilization R27_GPU_UTIL (default 0.6:
#          memcheck needs room of its own); each pass limited to PASS_S (default 200) seconds,
#          the probe (two passes) to 2 x PASS_S + 20, both cut to the wall left.
#   tiny   the same probe on the tiny Qwen3.5 + MTP (environments/h200.yaml defaults), PASS_S
#          per pass (a cheap check of the plan before the 27B shape).
# Results under $OUT (at most 6 files): writer-034.txt (versions, one line per step: rc, wall,
# the PROBE line / the benchmark's lines), writer-034.tgz (every probe's folder: watch-summary.json,
# pass*/{writer,sanitizer,verdict}.json, pass*/watch/{watch,api_writes,modules}.json, pass.log
# and sanitizer.log cut to 2 MB; re-packed after every step so a cut call still returns it),
# step_overhead.json / step_overhead.log (bench). Commit the unpacked folders under
# outputs/<card>/writer-034-<date>/.
#
# CPU rehearsal of every entry point (tiny shape, no bundle, no GPU; the sanitizer form is the
# page twin there):
#   REHEARSE=1 STEPS="bench tiny" KINDS="alias_fill memset" PYTHON=.venv/bin/python \
#     OUT=/tmp/writer/rehearse bash scripts/gpu_writer_034.sh
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu-writer-034-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/gpu-writer-034}; mkdir -p "$WORK"
SUM="$OUT/writer-034.txt"
PY=${PYTHON:-python3}
WALL=${WALL_S:-530}
STEPS=${STEPS:-bench}
say() { echo "$*" | tee -a "$SUM"; }
left() { echo $(( WALL - ($(date +%s) - T0) )); }
if [ -z "${REHEARSE:-}" ]; then
  if ! "$PY" -c "import vllm" 2>/dev/null; then
    [ -f .bundle/install.sh ] || { say "no vLLM and no .bundle/install.sh (carry .bundle)"; exit 2; }
    eval "$(bash .bundle/install.sh .bundle)" || { say "vLLM bundle install failed"; exit 2; }
  fi
  if [ -f .bundle/install-flashinfer.sh ] && ! "$PY" -c "import flashinfer" 2>/dev/null; then
    eval "$(bash .bundle/install-flashinfer.sh .bundle)" || say "FlashInfer install failed"
  fi
  ENV_NAME=h200
  export COMPUTE_SANITIZER=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
else  # CPU: the same entry points on the tiny shape, the page twin
  ENV_NAME=cpu
  export WORKBOOK_TRITON_CPU=1
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WORKBOOK_CACHE=${WORKBOOK_CACHE:-/tmp/workbook-cache} VLLM_TRITON_FORCE_FIRST_CONFIG=1
export VLLM_USE_FLASHINFER_SAMPLER=0 WORKBOOK_OVERRUN_BYTES=${WORKBOOK_OVERRUN_BYTES:-6000}
{ date -u; [ -z "${REHEARSE:-}" ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [ -z "${REHEARSE:-}" ] && "$COMPUTE_SANITIZER" --version 2>&1 | tail -1
  "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
  echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?') steps: $STEPS; wall ${WALL}s"
} >> "$SUM" 2>&1
pack() {
  [ -n "$(ls -A "$WORK" 2>/dev/null)" ] || return 0
  (cd "$WORK" && find . -name sanitizer.log -size +2M -exec sh -c 'head -c 2000000 "$1" > "$1.head" && mv "$1.head" "$1"' _ {} \;
   tar czf "$OUT/writer-034.tgz.tmp" --exclude='*.parquet' --exclude='*.ipynb' . 2>/dev/null) \
    && mv "$OUT/writer-034.tgz.tmp" "$OUT/writer-034.tgz"
}
r27_set=()
layers=${R27_LAYERS:-8}
if [ -n "$layers" ] && [ -z "${REHEARSE:-}" ]; then
  lt=$("$PY" -c "import json,sys; n=int(sys.argv[1]); print(json.dumps((['linear_attention']*3+['full_attention'])*(n//4)))" "$layers")
  r27_set=(--set "engine_kwargs={\"gdn_prefill_backend\": \"triton\", \"enable_flashinfer_autotune\": false, \"hf_overrides\": {\"text_config\": {\"num_hidden_layers\": $layers, \"layer_types\": $lt}}}")
fi
probe() {  # name kind[@N] -- probe args...
  local name=$1 spec=$2 kind=${2%@*} stepargs=()
  shift 2
  [ "$spec" != "$kind" ] && stepargs=(--writer-step "${spec#*@}")
  local pass_s=${PASS_S:-200} lim
  lim=$(( 2 * pass_s + 20 ))
  [ "$lim" -gt "$(( $(left) - 15 ))" ] && lim=$(( $(left) - 15 ))
  if [ "$lim" -lt 60 ]; then say "$name: not started ($(left) s of the wall left)"; return; fi
  [ "$pass_s" -gt "$(( lim - 20 ))" ] && pass_s=$(( lim - 20 ))
  local t0; t0=$(date +%s)
  timeout -s INT -k 20 "$lim" "$PY" -m workbook.run.writer.command --probe "$kind" "${stepargs[@]}" \
    --sanitize auto --caching "${CACHING:-on}" --out "$WORK/$name" --timeout "$pass_s" "$@" \
    > "$WORK/$name.log" 2>&1
  local rc=$? line
  line=$(grep -E "^PROBE " "$WORK/$name.log" | tail -1)
  [ -z "$line" ] && line="no PROBE line: $(grep -E 'Error|error:' "$WORK/$name.log" | tail -1 | cut -c1-300)"
  say "$name rc=$rc $(( $(date +%s) - t0 ))s (limit ${lim}s, ${pass_s}s a pass) $line"
  grep -E "^(this pass|sanitize plan|also named|FIRST WRITER|sanitizer stage|== culprit)" "$WORK/$name.log" \
    | sed 's/^/  /' | cut -c1-600 | tee -a "$SUM" >/dev/null
  pack
}
for step in $STEPS; do
  case $step in
  bench)
    lim=${BENCH_S:-480}; [ "$lim" -gt "$(( $(left) - 10 ))" ] && lim=$(( $(left) - 10 ))
    if [ "$lim" -lt 60 ]; then say "bench: not started ($(left) s of the wall left)"; continue; fi
    benv=(--env "$ENV_NAME" --run "${BENCH_RUN:-r27-mtp-cudagraphs}")
    [ -n "${REHEARSE:-}" ] && benv=(--env cpu --run reported-mtp)
    t0=$(date +%s)
    timeout -s INT -k 20 "$lim" "$PY" benchmarks/step_overhead.py "${benv[@]}" --watch \
      --arms "${BENCH_ARMS:-none,guard,trace,rowcheck,watch}" --batch 4 \
      --max-tokens "${BENCH_TOKENS:-32}" --rounds "${BENCH_ROUNDS:-3}" \
      --sampling '{}' --sampling '{"temperature": 0.8, "seed": 1}' --cfg "${BENCH_CFG:-{\}}" \
      --json-out "$OUT/step_overhead.json" > "$WORK/step_overhead.log" 2>&1
    say "bench rc=$? $(( $(date +%s) - t0 ))s (limit ${lim}s)"
    grep -E "ms/step|^-- sampling" "$WORK/step_overhead.log" | tee -a "$SUM"
    grep -vE "^(INFO|DEBUG|WARNING|\(|\[)" "$WORK/step_overhead.log" | tail -c 200000 > "$OUT/step_overhead.log" ;;
  r27)
    for spec in ${KINDS:-alias_fill copy}; do
      if [ -n "${REHEARSE:-}" ]; then
        probe "r27rehearse-${spec/@/-step}" "$spec" --env cpu --set cpu_profile_run=true --set max_tokens=4
      else
        probe "r27-${layers}L-auto-${spec/@/-step}-caching-${CACHING:-on}" "$spec" --env h200 \
          --run "${R27_RUN:-r27-nvfp4-mtp-flashinfer}" --set max_tokens=4 \
          --set gpu_memory_utilization="${R27_GPU_UTIL:-0.6}" "${r27_set[@]}"
      fi
    done ;;
  warm)  # the r27 start-up watched without sanitizer and writer: FlashInfer's JIT cache warm
         # for the memcheck passes, and the healthy 27B shape on 0.34 (no false alarm)
    lim=${WARM_S:-330}; [ "$lim" -gt "$(( $(left) - 10 ))" ] && lim=$(( $(left) - 10 ))
    if [ "$lim" -lt 60 ]; then say "warm: not started ($(left) s of the wall left)"; continue; fi
    t0=$(date +%s)
    if [ -n "${REHEARSE:-}" ]; then
      wargs=(--env cpu --set max_tokens=4)
    else
      wargs=(--env h200 --run "${R27_RUN:-r27-nvfp4-mtp-flashinfer}" --set max_tokens=4
             --set gpu_memory_utilization="${R27_GPU_UTIL:-0.6}" "${r27_set[@]}")
    fi
    timeout -s INT -k 20 "$lim" "$PY" -m workbook.cli watch --localize none --caching "${CACHING:-on}" \
      --timeout "$(( lim - 15 ))" --out "$WORK/warm-healthy" "${wargs[@]}" > "$WORK/warm-healthy.log" 2>&1
    say "warm rc=$? $(( $(date +%s) - t0 ))s (limit ${lim}s)"
    grep -E "^(== |INTACT|WATCHED|budget:|CORRUPTED|INCOMPLETE)" "$WORK/warm-healthy.log" | cut -c1-400 | tee -a "$SUM"
    pack ;;
  tiny)
    for spec in ${KINDS:-alias_fill copy}; do
      if [ -n "${REHEARSE:-}" ]; then
        probe "tiny-auto-${spec/@/-step}" "$spec" --env cpu --set cpu_profile_run=true --set max_tokens=4
      else
        probe "tiny-auto-${spec/@/-step}-caching-${CACHING:-on}" "$spec" --env h200 --set max_tokens=4 \
          --set gpu_memory_utilization=0.3
      fi
    done ;;
  *) say "unknown step $step (bench, warm, r27, tiny)" ;;
  esac
done
pack
say "total $(( $(date +%s) - T0 ))s"
ls -la "$OUT" >> "$SUM"
exit 0
