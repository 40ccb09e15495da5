#!/usr/bin/env bash
# One device call (H100/H200, vLLM 0.29 from .bundle/): the guard's take-back under speculative
# decoding (issue #26, workbook/hooks/guard/redraw.py) on CUDA — the kernel test with vLLM's own
# rejection_sample as the oracle, the engine test (MTP, T = 0.8, H-d-unbudgeted / H-d-twice /
# H-d-early), then the guard's step-time ratio greedy and sampled-with-seed (the redraw's cost).
# Back under $OUT: guard-redraw.txt (pytest's lines, both benchmarks' summaries), *.json.
set -uo pipefail
T0=$(date +%s); mkdir -p "$OUT"
R="$OUT/guard-redraw.txt"
python3 -c "import vllm" 2>/dev/null || eval "$(bash .bundle/install.sh .bundle)" \
  || { echo "bundle install failed" > "$R"; exit 2; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 VLLM_USE_V2_MODEL_RUNNER=1
{ nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"; } > "$R" 2>&1
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 420 python3 -m pytest -q -s -p no:cacheprovider tests/test_guard.py \
    -k "rejection_sampled or sampled_ends_with_vllms_draw or takes_back_a_sampled_row" \
    > /tmp/redraw-pytest.log 2>&1
  echo "pytest rc=$? $(( $(date +%s) - T0 ))s" >> "$R"
  grep -E "^(vLLM:|guard:|without the forcing:|none |mtp )|passed|failed|skipped|Error|assert" \
    /tmp/redraw-pytest.log | tail -40 >> "$R"
fi
if [ -n "${BENCH:-}" ]; then
  for arm in greedy sampled; do
    extra=""; [ "$arm" = sampled ] && extra="--temperature 0.8 --seed 1"
    timeout 240 python3 benchmarks/guard_overhead.py --rounds 6 --num-reqs 8 --max-tokens 64 \
      $extra --json "$OUT/guard-$arm.json" > /tmp/bench-$arm.log 2>&1
    echo "bench $arm rc=$? $(( $(date +%s) - T0 ))s" >> "$R"
    grep -vE "^(INFO|WARNING|\(|DEBUG)" /tmp/bench-$arm.log | tail -12 >> "$R"
  done
fi
echo "total $(( $(date +%s) - T0 ))s" >> "$R"
