#!/usr/bin/env bash
# vLLM 0.34 on the borrowed H200, one device call (<= 10 minutes): does the workbook hook it?
# The tiny Qwen3.5 + MTP k=4 shape of environments/h200.yaml (MRV2, FA3, eager), with the
# vLLM 0.34.0 offline bundle in .bundle/ (scripts/bundle/build-bundle.sh; see docs/gpu.md "On a
# GPU host"). Steps, each in its own process with its own time limit, so partial results land:
#   preflight  (90 s)  versions, hook-point table (import + source), compiled ops load on torch 2.11
#   catalogue (240 s)  reported request, checks A/B, tracer token identity, guard identity,
#                      the catalogue's fault matrix (named hypothesis, exact row, guard), and the
#                      server check's in-process equivalent (logprobs_mode=processed_logprobs)
#   matrix    (110 s)  workbook run h200 --in-process: the reported request + A/B, CUDA graphs,
#                      faults with/without the guard, through the pipeline (diagnosis files)
#   watch     (100 s)  workbook run h200 --in-process: the start-up watch on a hidden MTP writer
# Results: $OUT/versions-gpu.tgz (every JSON and log) and $OUT/summary.txt.
#   eval "$(bash .bundle/install.sh .bundle)" && bash scripts/versions_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/versions-out}; W=/tmp/versions-work
rm -rf "$W"; mkdir -p "$OUT" "$W"
T_ALL=$(date +%s)
SUM="$W/summary.txt"
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
  [ -f .bundle/install.sh ] && eval "$(bash .bundle/install.sh .bundle)"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 WORKBOOK_CACHE=/tmp/workbook-cache
export VLLM_TRITON_FORCE_FIRST_CONFIG=1 VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$W/gpu.txt" 2>&1
cat "$W/gpu.txt" | tee -a "$SUM"

step() {  # step NAME SECONDS CMD...: run, record rc and seconds, never stop the script
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  timeout -s INT -k 15 "$secs" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "step $name rc=$rc in $(( $(date +%s) - t0 )) s (limit $secs s)" | tee -a "$SUM"
}

step preflight "${PRE_S:-90}" python3 scripts/version_check.py preflight --json "$W/preflight.json"
step catalogue "${CAT_S:-240}" python3 scripts/version_check.py catalogue --env h200 \
  --json "$W/catalogue.json"
step matrix "${MAT_S:-110}" python3 -m workbook.cli run h200 --in-process --no-report \
  --no-progress --out "$W/outputs" --only mtp-eager mtp-cudagraphs no-spec-eager fault-H-a \
  fault-H-a-guard fault-H-f-cudagraphs fault-H-f-cudagraphs-guard
step watch "${WATCH_S:-100}" python3 -m workbook.cli run h200 --in-process --no-report \
  --no-progress --out "$W/outputs" --only fault-H-i-profile-mtp-guard

python3 - "$W" >> "$SUM" 2>&1 <<'PYEOF'
import glob, json, os, sys
w = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(w, name)))
    except Exception as e:
        return {"missing": f"{name}: {e}"}
p = load("preflight.json")
print("preflight:", json.dumps({k: p.get(k) for k in ("vllm", "torch", "device", "hookpoints_error",
      "missing")}), json.dumps(p.get("hookpoints_source", {}).get("errors")))
print("extensions:", json.dumps(p.get("extensions")))
print("packages:", json.dumps(p.get("packages")))
c = load("catalogue.json")
for k in ("missing", "engine_start_s", "effective", "reported", "checks", "tracer_identity",
          "guard_identity", "fault_matrix", "server_check", "timings"):
    if k in c:
        print(f"catalogue.{k}:", json.dumps(c[k], default=str)[:1500])
for r in c.get("faults", []):
    print("  fault", r.get("fault"), "->", r.get("verdict"), "named", r.get("named"),
          "expected", r.get("expected"), "exact_row", r.get("exact_row"), "guard",
          r.get("guard_honored"), r.get("error", ""))
for path in sorted(glob.glob(os.path.join(w, "outputs", "*", "*", "manifest.json"))):
    m = json.load(open(path))
    print("batch", os.path.basename(os.path.dirname(path)), m.get("status"),
          json.dumps(m.get("verdicts")))
    for v in sorted(glob.glob(os.path.join(os.path.dirname(path), "*", "verdict.json"))):
        d = json.load(open(v))
        print("  ", os.path.basename(os.path.dirname(v)), d.get("verdict"), d.get("hypothesis"),
              (d.get("first_violation") or {}).get("output_index"),
              (d.get("integrity") or {}).get("verdict") if isinstance(d.get("integrity"), dict)
              else "")
PYEOF
echo "total $(( $(date +%s) - T_ALL )) s" | tee -a "$SUM"
cp "$SUM" "$OUT/summary.txt"
tar czf "$OUT/versions-gpu.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
exit 0
