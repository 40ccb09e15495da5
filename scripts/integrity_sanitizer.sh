#!/usr/bin/env bash
# The writer search's second stage on a GPU host: one watched start-up (+ the reported request)
# under compute-sanitizer memcheck, with PyTorch's caching allocator off so every tensor is its
# own cudaMalloc; memcheck's report is parsed and tied to the watched addresses of that very run
# (workbook.run.writer.sanitizer).
#
#   scripts/integrity_sanitizer.sh OUT [workbook watch arguments]
#       default arguments: --env h200 --run watch-mtp   (tiny Qwen3.5 + MTP k=4, MRV2, eager)
#   DRY_RUN=1 scripts/integrity_sanitizer.sh OUT --set max_tokens=4     # CPU: no sanitizer; a
#       synthetic memcheck log (one write just past the start marker) exercises parse + tie
#
# This is plain memcheck: a write inside a live allocation (the markers themselves) is invisible
# to it. To name such a writer use `workbook watch --sanitize nvtx` (issue #19: the markers made
# read-only through NVTX memory permissions; scripts/writer_gpu.sh).
#
# Writes OUT/run/ (the watched run: pass1-none/watch.json, verdict.json, ...),
# OUT/sanitizer.log (memcheck's own log), OUT/sanitizer.json (errors tied to watched tensors),
# and prints the verdict. Environment: PYTHON (default python3), COMPUTE_SANITIZER (default
# /usr/local/cuda/bin/compute-sanitizer), SANITIZER_TIMEOUT (seconds, default 1500).
set -euo pipefail
OUT=${1:?usage: integrity_sanitizer.sh OUT [workbook watch arguments]}
shift
[ "$#" -gt 0 ] || set -- --env h200 --run watch-mtp
PY=${PYTHON:-python3}
SAN=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
t0=$(date +%s)
rc=0
if [ "${DRY_RUN:-0}" = "1" ]; then
  echo "== DRY_RUN: the watched start-up without compute-sanitizer"
  "$PY" -m workbook.cli watch --localize none --out "$OUT/run" "$@" > "$OUT/watch.out" 2>&1 || rc=$?
  WATCH="$OUT/run/pass1-none/watch.json"
  "$PY" -m workbook.run.writer.sanitizer --synthetic "$WATCH" > "$OUT/sanitizer.log"
else
  [ -x "$SAN" ] || { echo "no compute-sanitizer at $SAN (set COMPUTE_SANITIZER)" >&2; exit 2; }
  echo "== $SAN --tool memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING=1): workbook watch $*"
  timeout "${SANITIZER_TIMEOUT:-1500}" "$SAN" --tool memcheck --target-processes all \
    --print-limit 10000 --log-file "$OUT/sanitizer.log" \
    "$PY" -m workbook.cli watch --localize none --out "$OUT/run" "$@" > "$OUT/watch.out" 2>&1 || rc=$?
  WATCH="$OUT/run/pass1-none/watch.json"
  [ -f "$WATCH" ] || WATCH="$OUT/run/pass1-none/watch/watch.json"
fi
echo "== watched run exited $rc after $(( $(date +%s) - t0 )) s (log: $OUT/watch.out)"
tail -n 25 "$OUT/watch.out" | grep -E "FIRST|INTACT|phases that ran|culprit|hypothesis|phase:|module:|op:" || true
"$PY" -m workbook.run.writer.sanitizer "$OUT/sanitizer.log" --watch "$WATCH" -o "$OUT/sanitizer.json"
echo "$OUT/sanitizer.json"
