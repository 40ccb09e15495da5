#!/usr/bin/env bash
# One device call (H100/H200, vLLM 0.34 from .bundle/): vLLM's own MRV2 sampler tests with and
# without the workbook's hooks (issue 41, non-interference on CUDA) — every test that passes
# without the hooks must pass with them. The tests: vLLM 0.34.0's sdist, extracted (tests/ only,
# ignored by git) to .bundle/vllm-tests/ of the checkout that travels:
#   tar xzf vllm-0.34.0.tar.gz --strip-components=1 -C .bundle/vllm-tests \
#     --wildcards 'vllm-0.34.0/tests/__init__.py' 'vllm-0.34.0/tests/v1/__init__.py' \
#     'vllm-0.34.0/tests/v1/worker/*' 'vllm-0.34.0/tests/v1/sample/*' \
#     'vllm-0.34.0/tests/utils.py' 'vllm-0.34.0/tests/conftest.py'
# Usage: bash scripts/gpu_vllm_tests.sh [TESTS_ROOT]   (default .bundle/vllm-tests)
# Back under $OUT: vllm-tests-gpu.txt (GPU, versions, the side-by-side counts, any test that
# passed only without the hooks), vllm-tests-gpu/{without,with}.{xml,log}, summary.json.
# Under 5 minutes: the test files build vLLM's states directly (no model); --noconftest keeps
# vLLM's conftest (test-only packages, model fixtures) out.
set -uo pipefail
T0=$(date +%s); OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
ROOT="${1:-.bundle/vllm-tests}"
R="$OUT/vllm-tests-gpu.txt"
[ -d "$ROOT/tests/v1/worker" ] || { echo "no vLLM tests under $ROOT/tests/v1/worker (extract the sdist's tests/ there)" | tee "$R"; exit 2; }
python3 -c "import vllm" 2>/dev/null || eval "$(bash .bundle/install.sh .bundle)" \
  || { echo "bundle install failed" > "$R"; exit 2; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__, 'cuda', torch.cuda.is_available())"; } > "$R" 2>&1
FILES=""
for f in test_gpu_thinking_budget.py test_gpu_logit_bias.py test_gpu_bad_words.py \
         test_gpu_sampler_flags.py test_gpu_rejection_sampler_chunking.py test_gpu_rejection_sampler_i64.py; do
  [ -f "$ROOT/tests/v1/worker/$f" ] && FILES="$FILES tests/v1/worker/$f" || echo "missing: $f" >> "$R"
done
timeout 280 python3 scripts/vllm_tests_with_hooks.py "$ROOT" $FILES --out "$OUT/vllm-tests-gpu" \
  --timeout 130 --pytest-arg=--noconftest > "$OUT/vllm-tests-gpu.log" 2>&1
echo "rc=$? (0: every test that passed without the hooks passed with them; 1: not; 2: bad input)" >> "$R"
sed -n '/^vLLM /,$p' "$OUT/vllm-tests-gpu.log" >> "$R"
cp "$OUT/vllm-tests-gpu/summary.json" "$OUT/" 2>/dev/null
echo "total $(( $(date +%s) - T0 ))s" >> "$R"
cat "$R"
