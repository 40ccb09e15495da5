#!/usr/bin/env bash
# Fetch FlashInfer 0.6.18 (vLLM 0.29.0's pin, the reporter's version) for the offline GPU host,
# pack it small and write its host-side installer. Runs on any Linux machine with Python 3, pip
# and PyPI; the GPU host needs no network.
#
#   bash scripts/fetch_flashinfer.sh OUTDIR [--full] [--wheels-dir DIR] [--part-size BYTES]
#                                           [--threads N] [--no-pack]
#
# Writes:
#   DIR/*.whl                          the pinned wheels (default DIR: OUTDIR/wheels; pip checks
#                                      each against its sha256, --require-hashes)
#   OUTDIR/flashinfer-<id>.tar.xz.NN   the wheels unpacked into one tree, tar | xz -9e, split
#                                      into parts of at most --part-size bytes (default 60,000,000)
#   OUTDIR/install-flashinfer.sh       host-side installer (see its header; mirrors the vLLM
#                                      bundle's install.sh: install / --env / stash / status / check)
#
# What is fetched. Default ("core"): flashinfer-python 0.6.18 alone. That is enough for vLLM's
# FLASHINFER attention backend and the FlashInfer top-k/top-p sampler on the H200: both
# JIT-compile their CUDA kernels with the host's nvcc (CUDA 13.0) from sources in the wheel.
# Of its Requires-Dist the host already has click, einops, ninja, numpy, nvidia-ml-py,
# packaging, requests, tabulate, torch, tqdm and cuda-bindings/cuda-core/cuda-pathfinder, and
# apache-tvm-ffi (0.1.15.post2; FlashInfer wants >=0.1.6,<0.2) comes with the vLLM bundle, so
# use this together with that bundle. `import flashinfer` needs nothing else (checked with
# exactly those packages).
#
# --full adds the rest of its Requires-Dist, which only FlashInfer's CuTe-DSL / cuDNN / cuTile /
# NCCL paths import: FlashInfer's GDN prefill kernel (vLLM's default GDN prefill on Hopper;
# with core pass gdn_prefill_backend="triton" — the reporter's Thor, sm_110, runs Triton GDN
# prefill anyway), CuTe-DSL MoE/GEMM kernels, cuDNN attention/GEMM, all-reduce fusions.
# Sizes (2026-12-03): core 18.3 MB of wheels -> one 7.3 MB part (96.7 MB unpacked; 94 s of
# xz on 2 cores); full 129.4 MB -> 83.1 MB in two parts (400.8 MB unpacked; 15 min of xz).
#   nvidia-cutlass-dsl 4.6.2 (vLLM's pin) + libs-base/-core/-cu13, nvidia-cuda-nvdisasm 13.5,
#   nvidia-cudnn-frontend 1.31.0 (the newest that accepts cutlass-dsl 4.6.2), cuda-tile 1.7.0,
#   nccl4py 0.6.0. The cuda-python metapackage is not fetched: it only pulls cuda-bindings,
#   which the host has.
# Not available: flashinfer-cubin for 0.6.18 (PyPI stops at 0.6.13; only TRT-LLM-gen/XQA
# kernels need cubins, and vLLM uses those on Hopper for decode only when NVIDIA's artifactory
# answers, which it cannot offline) and flashinfer-jit-cache (flashinfer.ai's own index, not
# reachable from here).
set -euo pipefail

FI_VERSION=0.6.18
LOCK_CORE="flashinfer_python-0.6.18-py3-none-any.whl d5d26edb48f8def0bf28b2c94415aef7f0754e2cd9e3cb3d6e7081262d068aad"
LOCK_FULL="$LOCK_CORE
cuda_tile-1.7.0-cp312-cp312-manylinux2014_x86_64.whl f886e84a7b54de5e26598eb9a828387a4c87e6ab5b986838cd8a5277a9ffab40
nccl4py-0.6.0-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl f4006cf8c12c26ed29811b80858a58f8f31e4b42ea85b6c1d23401981449ab9d
nvidia_cuda_nvdisasm-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca
nvidia_cudnn_frontend-1.31.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl 3171f102254136418f24b4470dfa5419f34b03d9d792a4b773cf65c7a37e6bf8
nvidia_cutlass_dsl-4.6.2-py3-none-any.whl 06ac62deb182a852dfb053032cf945bf02b9aa1bf502a18b129d280d7babb26c
nvidia_cutlass_dsl_libs_base-4.6.2-cp312-cp312-manylinux_2_28_x86_64.whl 24dfaddad6077fd0de14eecaf66a72762f2f5f30ae1872231f5bf8b243ac2eac
nvidia_cutlass_dsl_libs_core-4.6.2-py3-none-any.whl 571d4b46fca1bfbb123d0dc348eaa7fd80af0014ddffc07b849e8195b2364333
nvidia_cutlass_dsl_libs_cu13-4.6.2-cp312-cp312-manylinux_2_28_x86_64.whl a299a623fad75eb752c1a4e447b924e9049ed396b037509c41a48da82d1f340a"

say() { echo "fetch-flashinfer: $*" >&2; }
die() { echo "fetch-flashinfer: ERROR: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

OUT="" TIER=core WHL="" PART_SIZE=60000000 THREADS="$(nproc 2>/dev/null || echo 1)" PACK=1
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --full) TIER=full ;;
    --wheels-dir) WHL="${2:?--wheels-dir needs a folder}"; shift ;;
    --part-size) PART_SIZE="${2:?--part-size needs bytes}"; shift ;;
    --threads) THREADS="${2:?--threads needs a number}"; shift ;;
    --no-pack) PACK=0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$OUT" ] || die "one OUTDIR only"; OUT="$1" ;;
  esac
  shift
done
[ -n "$OUT" ] || { usage; exit 2; }
PY="${PYTHON:-python3}"
for t in "$PY" tar xz sha256sum split; do command -v "$t" >/dev/null || die "'$t' not found"; done
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
WHL="${WHL:-$OUT/wheels}"; mkdir -p "$WHL"; WHL="$(cd "$WHL" && pwd)"
CACHE="$OUT/.cache"; mkdir -p "$CACHE"
LOCK="$LOCK_CORE"; [ "$TIER" = full ] && LOCK="$LOCK_FULL"
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1. Download what is not cached (pip takes only the pinned files).
REQ="$CACHE/requirements-$TIER.txt"; : > "$REQ"; n_missing=0
while read -r fname sha; do
  f="$WHL/$fname"
  if [ -f "$f" ] && [ "$(sha_of "$f")" = "$sha" ]; then continue; fi
  rm -f "$f"
  name="${fname%%-*}"; rest="${fname#*-}"; ver="${rest%%-*}"
  echo "$name==$ver --hash=sha256:$sha" >> "$REQ"
  n_missing=$((n_missing + 1))
done <<< "$LOCK"
say "$TIER: $(grep -c . <<< "$LOCK") wheel(s), $n_missing to download"
if [ "$n_missing" -gt 0 ]; then
  "$PY" -m pip download --no-deps --only-binary=:all: --require-hashes \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --progress-bar off -d "$WHL" -r "$REQ" >&2 || die "pip download failed (see above)"
fi
total=0
while read -r fname sha; do
  f="$WHL/$fname"
  [ -f "$f" ] || die "$fname missing after download"
  [ "$(sha_of "$f")" = "$sha" ] || die "$fname: sha256 mismatch"
  total=$((total + $(stat -c %s "$f")))
done <<< "$LOCK"
say "wheels verified in $WHL: $total bytes"
[ "$PACK" = 1 ] || exit 0

# 2. Unpack into one tree and pack it (cached on the lock and this script).
KEY="$( { echo "$LOCK"; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
ARCHIVE="$CACHE/archive-$TIER-$KEY.tar.xz"
if [ -f "$ARCHIVE" ] && [ -f "$ARCHIVE.ok" ]; then
  say "reusing cached archive $ARCHIVE"
else
  rm -f "$CACHE"/archive-"$TIER"-*.tar.xz "$CACHE"/archive-"$TIER"-*.tar.xz.ok
  SITE="$CACHE/site-$TIER"; rm -rf "$SITE"; mkdir -p "$SITE"
  LOCK_TEXT="$LOCK" "$PY" - "$WHL" "$SITE" <<'PYEOF' || die "unpacking failed"
import os, sys, zipfile
whl_dir, site = sys.argv[1], sys.argv[2]
owner = {}
for line in os.environ["LOCK_TEXT"].splitlines():
    fname = line.split()[0]
    with zipfile.ZipFile(os.path.join(whl_dir, fname)) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/"):
                continue
            if ".." in name.split("/") or name.startswith("/"):
                sys.exit(f"unsafe path {name!r} in {fname}")
            if name.endswith(".pth"):  # not read from PYTHONPATH; install-flashinfer.sh adds its path
                continue
            if name in owner:
                sys.exit(f"{name} is in both {owner[name]} and {fname}")
            owner[name] = fname
            dest = os.path.join(site, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.chmod(dest, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
print(f"{len(owner)} files", file=sys.stderr)
PYEOF
  say "packing with xz -9e (threads: $THREADS)"
  t0=$(date +%s)
  ( cd "$SITE" && tar --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime='2026-01-01 00:00:00Z' --format=gnu -cf - . ) \
    | xz -9e -T"$THREADS" -c > "$ARCHIVE.tmp" || die "tar | xz failed"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  du -sb "$SITE" | cut -f1 > "$ARCHIVE.ok"
  say "packed in $(( $(date +%s) - t0 )) s"
  rm -rf "$SITE"
fi
UNPACKED_BYTES="$(cat "$ARCHIVE.ok")"

# 3. Split and write the installer.
ARCH_SHA="$(sha_of "$ARCHIVE")"; ID="${ARCH_SHA:0:12}"
PREFIX="flashinfer-$ID.tar.xz"
rm -f "$OUT"/flashinfer-*.tar.xz.[0-9][0-9] "$OUT/install-flashinfer.sh"
split -b "$PART_SIZE" -d -a 2 "$ARCHIVE" "$OUT/$PREFIX."
PARTS=""
for f in "$OUT/$PREFIX".[0-9][0-9]; do
  PARTS="$PARTS$(basename "$f") $(stat -c %s "$f") $(sha_of "$f")"$'\n'
done
PARTS="${PARTS%$'\n'}"

{
  cat <<EOF
#!/usr/bin/env bash
# FlashInfer $FI_VERSION ($TIER) for the offline GPU host: archive $ID, unpacked $UNPACKED_BYTES bytes.
# Use after the vLLM bundle's install.sh (it brings apache-tvm-ffi and vLLM itself):
#
#   eval "\$(bash .bundle/install.sh .bundle)" && eval "\$(bash .bundle/install-flashinfer.sh .bundle)"
#
#   eval "\$(bash install-flashinfer.sh [DIR ...])"   find the parts in DIR ... (default: this
#         script's folder) and in /tmp/flashinfer-parts, check their sha256, unpack into
#         /tmp/flashinfer-site (skipped when already unpacked) and print the environment lines.
#   eval "\$(bash install-flashinfer.sh --env)"       only print them (fails if not unpacked).
#   bash install-flashinfer.sh stash [PATH ...]       keep parts in /tmp/flashinfer-parts for a
#         later copy (/tmp survives between copies while the host stays up).
#   bash install-flashinfer.sh status                 where the parts are, whether unpacked.
#   bash install-flashinfer.sh check                  after the evals: import flashinfer, find
#         nvcc and tvm_ffi, report what vLLM will see.
#
# The environment lines: PYTHONPATH gets /tmp/flashinfer-site first; VLLM_USE_FLASHINFER_SAMPLER
# is unset (the vLLM bundle sets 0; unset is vLLM's default, FlashInfer sampler where supported,
# as on the reporter's host); FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-cache keeps FlashInfer's
# JIT builds between copies; /usr/local/cuda/bin joins PATH when nvcc is not on it (vLLM's
# has_flashinfer() needs nvcc on PATH) and CUDA_HOME defaults to /usr/local/cuda.
# On failure stdout carries \`false\`, so \`eval "\$(...)" && ...\` stops.
# Overrides: FLASHINFER_SITE (default /tmp/flashinfer-site), FLASHINFER_PARTS
# (default /tmp/flashinfer-parts), PYTHON (default python3).
set -euo pipefail
ARCH_SHA="$ARCH_SHA"
ID="$ID"
TIER="$TIER"
UNPACKED_BYTES="$UNPACKED_BYTES"
PARTS="\$(cat <<'PARTS_EOF'
$PARTS
PARTS_EOF
)"
EOF
  cat <<'EOF'
SITE="${FLASHINFER_SITE:-/tmp/flashinfer-site}"
STASH="${FLASHINFER_PARTS:-/tmp/flashinfer-parts}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MARK="$SITE/.flashinfer-archive-sha256"
EMIT_FALSE=0
say() { echo "flashinfer: $*" >&2; }
die() { echo "flashinfer: ERROR: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -ne 0 ] && [ "$EMIT_FALSE" = 1 ] && echo false; exit $rc' EXIT
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
installed() { [ -f "$MARK" ] && [ "$(cat "$MARK")" = "$ARCH_SHA" ] && [ -f "$SITE/flashinfer/__init__.py" ]; }

print_env() {
  local p="$SITE"
  [ -d "$SITE/nvidia_cutlass_dsl/dsl_packages" ] && p="$p:$SITE/nvidia_cutlass_dsl/dsl_packages"
  printf 'case ":${PYTHONPATH:-}:" in *:%s:*) ;; *) export PYTHONPATH=%s"${PYTHONPATH:+:$PYTHONPATH}" ;; esac\n' "$SITE" "$p"
  echo 'unset VLLM_USE_FLASHINFER_SAMPLER'
  echo 'export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-cache}"'
  echo 'export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"'
  echo 'command -v nvcc >/dev/null 2>&1 || { [ -x "$CUDA_HOME/bin/nvcc" ] && export PATH="$CUDA_HOME/bin:$PATH"; }'
}

find_part() {  # NAME SIZE SHA DIR...: the first good copy
  local name="$1" size="$2" sha="$3" d f; shift 3
  for d in "$@"; do
    f="$d/$name"; [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" = "$size" ] && [ "$(sha_of "$f")" = "$sha" ] && { echo "$f"; return 0; }
    say "ignoring $f: size or sha256 differ"
  done
  return 1
}

do_install() {
  EMIT_FALSE=1
  local dirs=("$@") paths=() missing="" name size sha p tmp
  [ ${#dirs[@]} -gt 0 ] || dirs=("$HERE")
  if installed; then say "FlashInfer archive $ID already unpacked in $SITE"; print_env; return 0; fi
  case "$SITE" in /?*/*) ;; *) die "FLASHINFER_SITE must be an absolute path two levels deep, got '$SITE'" ;; esac
  while read -r name size sha; do
    if p="$(find_part "$name" "$size" "$sha" "${dirs[@]}" "$STASH")"; then paths+=("$p"); else missing="$missing $name"; fi
  done <<< "$PARTS"
  [ -z "$missing" ] || die "missing part(s):$missing (looked in: ${dirs[*]} $STASH)"
  if [ -e "$SITE" ]; then
    [ -f "$MARK" ] || [ -z "$(ls -A "$SITE")" ] || die "$SITE exists and was not made by this installer"
    rm -rf "$SITE"
  fi
  tmp="$SITE.partial.$$"; rm -rf "$SITE".partial.*; mkdir -p "$tmp"
  say "unpacking ${#paths[@]} part(s) into $SITE ($UNPACKED_BYTES bytes)"
  if command -v xz >/dev/null 2>&1; then
    cat "${paths[@]}" | xz -dc -T0 | tar --no-same-owner -xf - -C "$tmp" || { rm -rf "$tmp"; die "unpacking failed"; }
  else
    cat "${paths[@]}" | "$PY" -c 'import sys, tarfile; t = tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz"); t.extractall(sys.argv[1], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$tmp" \
      || { rm -rf "$tmp"; die "unpacking failed"; }
  fi
  [ -f "$tmp/flashinfer/__init__.py" ] || { rm -rf "$tmp"; die "unpacked tree has no flashinfer/__init__.py"; }
  echo "$ARCH_SHA" > "$tmp/$(basename "$MARK")"
  mv -T "$tmp" "$SITE" || { rm -rf "$tmp"; installed || die "could not move the tree to $SITE"; }
  say "unpacked FlashInfer ($TIER, archive $ID) in $SITE"
  print_env
}

do_stash() {
  local srcs=("$@") n=0 name size sha s f
  [ ${#srcs[@]} -gt 0 ] || srcs=("$HERE")
  mkdir -p "$STASH"
  while read -r name size sha; do
    for s in "${srcs[@]}"; do
      if [ -d "$s" ]; then f="$s/$name"; elif [ "$(basename "$s")" = "$name" ]; then f="$s"; else continue; fi
      [ -f "$f" ] || continue
      if [ "$(stat -c %s "$f")" = "$size" ] && [ "$(sha_of "$f")" = "$sha" ]; then
        [ "$(readlink -f "$f")" = "$(readlink -f "$STASH/$name")" ] || { cp "$f" "$STASH/$name.tmp.$$" && mv "$STASH/$name.tmp.$$" "$STASH/$name"; }
        say "stashed $name in $STASH"; n=$((n + 1)); break
      fi
      say "WARNING: $f is not a good copy of $name; not stashed"
    done
  done <<< "$PARTS"
  [ "$n" -gt 0 ] || die "no part of archive $ID found in: ${srcs[*]}"
}

do_status() {
  local name size sha p
  echo "FlashInfer archive $ID ($TIER)"
  while read -r name size sha; do
    if p="$(find_part "$name" "$size" "$sha" "$HERE" "$STASH" 2>/dev/null)"; then echo "  part $name: $p"
    else echo "  part $name: MISSING"; fi
  done <<< "$PARTS"
  if installed; then echo "  unpacked: yes, in $SITE"; else echo "  unpacked: no ($SITE)"; fi
}

do_check() {
  echo "nvcc: $(command -v nvcc || echo 'NOT ON PATH (vLLM then reports FlashInfer unavailable)')"
  "$PY" - <<'PYEOF'
import importlib.util, os
for m in ("tvm_ffi", "flashinfer", "vllm", "cutlass", "cudnn"):
    s = importlib.util.find_spec(m)
    print(f"{m}: {os.path.dirname(s.origin) if s and s.origin else 'not found'}")
import flashinfer
print("flashinfer", flashinfer.__version__, "JIT cache:", __import__("flashinfer.jit.env", fromlist=["x"]).FLASHINFER_CACHE_DIR)
print("VLLM_USE_FLASHINFER_SAMPLER:", os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "(unset: on where supported)"))
try:
    from vllm.utils.flashinfer import has_flashinfer
    print("vllm has_flashinfer():", has_flashinfer())
except Exception as e:  # vLLM not on the path
    print("vllm has_flashinfer(): n/a:", e)
PYEOF
}

case "${1:-}" in
  -h|--help|help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" ;;
  --env) EMIT_FALSE=1; installed || die "FlashInfer archive $ID is not unpacked in $SITE"; print_env ;;
  stash) shift; do_stash "$@" ;;
  status) do_status ;;
  check) do_check ;;
  *) do_install "$@" ;;
esac
EOF
} > "$OUT/install-flashinfer.sh"
chmod 755 "$OUT/install-flashinfer.sh"

say "wrote $OUT/install-flashinfer.sh and $(grep -c . <<< "$PARTS") part(s):"
while read -r name size sha; do say "  $name $size bytes"; done <<< "$PARTS"
say "unpacked on the host: $UNPACKED_BYTES bytes. Copy only the part(s) and install-flashinfer.sh."
