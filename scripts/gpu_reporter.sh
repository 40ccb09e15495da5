#!/usr/bin/env bash
# On the borrowed H200 (no vLLM, no network): the reporter-shaped runs of environments/h200.yaml,
# one process per engine configuration (a 27B engine holds ~54 GB: engines must not pile up),
# plus the tiny model with FlashInfer attention. Results land in $OUT (one tarball + logs).
#   eval "$(bash .bundle/install.sh .bundle)" && eval "$(bash .bundle/install-flashinfer.sh .bundle)" \
#     && bash scripts/gpu_reporter.sh
# Env: GROUPS_OVERRIDE (';'-separated groups of run names), LIMIT_S (per group, default 200).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WORKBOOK_CACHE=/tmp/workbook-cache
export VLLM_TRITON_FORCE_FIRST_CONFIG=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
run_group() {  # run_group LABEL LIMIT [workbook run args...]
  local label=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout -s INT "$limit" python3 -m workbook.cli run h200 --in-process --no-report \
    --no-progress --out /tmp/wb-outputs "$@" > "/tmp/wb-$label.log" 2>&1
  local rc=$?
  echo "== $label rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -E "^[a-z0-9-]+: (ok|failed|timeout)|Fused multi-step|Using FlashInfer|FLASHINFER|Error|error:" \
    "/tmp/wb-$label.log" | grep -v "^DEBUG" | head -20
}
IFS=';' read -r -a groups <<< "${GROUPS_OVERRIDE:-tiny-flashinfer;r27-nvfp4-mtp-flashinfer;r27-mtp-cudagraphs r27-fault-H-a r27-fault-H-a-guard}"
for g in "${groups[@]}"; do
  case "$g" in
    tiny-flashinfer) run_group tiny-flashinfer "${LIMIT_S:-200}" --only mtp-eager no-spec-eager \
                       --set attention_backend=FLASHINFER ;;
    *) run_group "${g%% *}" "${LIMIT_S:-200}" --only $g ;;
  esac
done
tar czf "$OUT/h200-outputs.tgz" -C /tmp/wb-outputs . 2>/dev/null
tail -c 200000 -q /tmp/wb-*.log > "$OUT/logs.txt" 2>/dev/null
exit 0
