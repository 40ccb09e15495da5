#!/usr/bin/env bash
# One device call (H100/H200, vLLM 0.29 from .bundle/): first the reasoning_end_str findings of
# issue #30 on the GPU (outputs/findings/reasoning-end-str/repro.py, plain vLLM, tiny MiMo, none
# and MTP k=4, MRV2), then the red-zone overrun study of issue #27 (scripts/gpu_redzone.sh).
# Everything comes back as at most 4 files under $OUT: session.txt, redzone-gpu.txt, redzone.tgz,
# reasoning-gpu.txt.
set -uo pipefail
T0=$(date +%s); mkdir -p "$OUT"
eval "$(bash .bundle/install.sh .bundle)" || { echo "bundle install failed" > "$OUT/session.txt"; exit 2; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"; } \
  > "$OUT/session.txt" 2>&1
M=$(python3 -c "from workbook.core import models; print(models.build('tiny-mimo-mtp'))" 2>>"$OUT/session.txt" | tail -1)
R="$OUT/reasoning-gpu.txt"
for spec in none mtp; do
  for END in '</think>\n\n' '\nOkay, I'"'"'m done thinking.\n</think>' 'Okay, done.'; do
    echo "== gpu vllm-0.29.0 $spec $END" >> "$R"
    VLLM_USE_V2_MODEL_RUNNER=1 timeout 120 python3 outputs/findings/reasoning-end-str/repro.py \
      "$M" "$END" $spec > /tmp/repro.out 2> /tmp/repro.err
    rc=$?; grep -E "^(END_STR|output|VIOLATED|ok)" /tmp/repro.out >> "$R"
    [ $rc -ne 0 ] && { echo "rc=$rc"; cat /tmp/repro.out /tmp/repro.err | grep -E "Error" | tail -3; } >> "$R"
    cat /tmp/repro.out /tmp/repro.err | grep -m1 -o "Using V2 Model Runner" >> "$R"
  done
done
[ -n "${SKIP_REDZONE:-}" ] && { echo "total $(( $(date +%s) - T0 ))s (red zones skipped)" >> "$OUT/session.txt"; exit 0; }
OUT=/tmp/rz-out bash scripts/gpu_redzone.sh > /tmp/gpu_redzone.log 2>&1
cp /tmp/rz-out/redzone-gpu.txt "$OUT/" 2>/dev/null
tar czf "$OUT/redzone.tgz" -C /tmp/rz-out . /tmp/gpu_redzone.log 2>/dev/null
echo "redzone done $(( $(date +%s) - T0 ))s" >> "$OUT/session.txt"
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/session.txt"
