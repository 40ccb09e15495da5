#!/usr/bin/env bash
# One device call (H100/H200, vLLM 0.29 from .bundle/): the distribution oracle of issue #30
# (workbook.run.constraints.distribution) at GPU throughput — thousands of samples per position, healthy
# cells repeated for the engine's false-alarm rate, both distribution faults for its power.
# Back under $OUT: distribution.txt (the run's lines), distribution.json, dist.tgz (engine logs).
set -uo pipefail
T0=$(date +%s); mkdir -p "$OUT"
python3 -c "import vllm" 2>/dev/null || eval "$(bash .bundle/install.sh .bundle)" \
  || { echo "bundle install failed" > "$OUT/distribution.txt"; exit 2; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 VLLM_USE_V2_MODEL_RUNNER=1
D=/tmp/dist-$(date +%s); SAMPLES=${SAMPLES:-8192}; REPEATS=${REPEATS:-2}; LIMIT=${LIMIT_S:-520}
CASES=${CASES:-unconstrained,allowed_token_ids}; FAULT_CASES=${FAULT_CASES:-unconstrained}
FAULTS=${FAULTS:-rejection-tempered-twice,draft-rows-untempered}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/distribution.txt"
timeout -s INT "$LIMIT" python3 -m workbook.run.constraints.distribution --out "$D" \
  --methods none,mtp --cases "$CASES" --fault-cases "$FAULT_CASES" \
  --faults "$FAULTS" --samples "$SAMPLES" --positions 4 \
  --max-num-seqs 256 --repeats "$REPEATS" > /tmp/dist.log 2>&1
echo "rc=$? $(( $(date +%s) - T0 ))s samples=$SAMPLES repeats=$REPEATS cases=$CASES fault-cases=$FAULT_CASES faults=$FAULTS" >> "$OUT/distribution.txt"
grep -vE "^(INFO|WARNING|\(|DEBUG)" /tmp/dist.log | grep -v "it/s\]" | tail -60 >> "$OUT/distribution.txt"
cp "$D"/distribution.json "$OUT/" 2>/dev/null
tar czf "$OUT/dist.tgz" -C /tmp "$(basename "$D")" dist.log 2>/dev/null
