#!/usr/bin/env bash
# Build an offline install bundle of vLLM 0.34.0 (or 0.29.0) for the GPU host
# (Python 3.12, torch 2.11.0+cu130, triton 3.6.0, transformers 5.17.0,
# no network, no vllm, no pydantic).  A copy of ../shared/gpu/build-bundle.sh (0.29.0 only),
# parameterized by version: one LOCK list of wheels + sha256 per version (LOCK_<version>).
#
#   bash build-bundle.sh OUTDIR [--vllm 0.34.0|0.29.0] [--sm 90|all] [--with-moe]
#        [--part-size BYTES] [--threads N] [--preset -9e|-9|-6]
#
# Runs on a Linux x86_64 machine with Python 3 + pip and access to PyPI.
# Writes into OUTDIR:
#   vllm-bundle-<id>.tar.xz.00 [.01 ...]  the bundle, split into parts of at most --part-size bytes
#   install.sh                            the installer for the GPU host (checksums of the parts inside)
#   .cache/                               downloaded wheels and the last archive (makes a rebuild fast)
# See README.md next to this script.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
VLLM_VERSION=0.34.0
PRESET=-9e
SM=90
WITH_MOE=0
PART_SIZE=60000000
THREADS="$(nproc 2>/dev/null || echo 2)"
OUT=""

die() { echo "build-bundle: ERROR: $*" >&2; exit 1; }
say() { echo "build-bundle: $*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) VLLM_VERSION="${2:?--vllm needs a value}"; shift 2 ;;
    --vllm=*) VLLM_VERSION="${1#--vllm=}"; shift ;;
    --preset) PRESET="${2:?--preset needs a value}"; shift 2 ;;
    --preset=*) PRESET="${1#--preset=}"; shift ;;
    --sm) SM="${2:?--sm needs a value}"; shift 2 ;;
    --sm=*) SM="${1#--sm=}"; shift ;;
    --with-moe) WITH_MOE=1; shift ;;
    --part-size) PART_SIZE="${2:?--part-size needs a value}"; shift 2 ;;
    --part-size=*) PART_SIZE="${1#--part-size=}"; shift ;;
    --threads) THREADS="${2:?--threads needs a value}"; shift 2 ;;
    --threads=*) THREADS="${1#--threads=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "only one OUTDIR, got '$OUT' and '$1'"; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || { usage >&2; die "OUTDIR missing"; }
case "$SM" in all|[1-9][0-9]|[1-9][0-9][0-9]) ;; *) die "--sm must be a number such as 90, or 'all'" ;; esac
case "$PART_SIZE" in ''|*[!0-9]*) die "--part-size must be a number of bytes" ;; esac
[ "$PART_SIZE" -ge 1000000 ] || die "--part-size is too small"

for t in "$PY" tar xz sha256sum split; do command -v "$t" >/dev/null || die "'$t' not found"; done
"$PY" -m pip --version >/dev/null 2>&1 || die "'$PY -m pip' does not work"
case "$(tar --version 2>/dev/null || true)" in *"GNU tar"*) ;; *) die "GNU tar is needed (for a reproducible archive)" ;; esac

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
CACHE="$OUT/.cache"
WHL="$CACHE/wheels"
WORK="$OUT/.work"
mkdir -p "$WHL"
T_START=$(date +%s)

# ---------------------------------------------------------------------------
# 1. Pinned wheels: file name and sha256 (every one from PyPI).
#    vllm plus the packages it needs at run time that the GPU host lacks
#    (found by an import scan of `LLM(...)` use against the host's package list).
# ---------------------------------------------------------------------------
LOCK_0_29_0="$(cat <<'EOF'
vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl 09d48617fc2be9c6cdcd5db480651ab0d84817b257204f2cc2e3ecbb70bbb635
llguidance-1.7.6-cp39-abi3-manylinux_2_31_x86_64.whl ceec951d29a74309984e3be0fe7f5f56c1362434cd937abd517b259a60908b1e
annotated_types-0.8.0-py3-none-any.whl f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0
apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl 059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b
blake3-1.0.11-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl 33424c686b291c7682b5816fe9320466dbc0a457ef7e15c273c804a2d70fea70
cachetools-8.0.2-py3-none-any.whl 502bf3c17c6e35d78ccdaa70da8c7001b28634541f5cde0dee33c93bb252277d
cbor2-6.3.0-cp312-cp312-manylinux_2_28_x86_64.whl 4f160b662059cc30ced4436fca332f4c27d0259698a5bde8373c9c6f829aabdf
compressed_tensors-0.17.0-py3-none-any.whl 4a1b89b508f7efb8ffb4eee8a6e69e0452d9b080cae130146025c64fbe9fa9aa
dnspython-2.9.2-py3-none-any.whl af15f7d385a6ae2fb35a796fde2138004c8c42c7389090e2addc83e3b3340fd8
email_validator-2.4.0-py3-none-any.whl 4454e41c4e1c6b6caee34a1dc71d5e736791562be8fd179b02e298f796522684
fastapi-0.136.3-py3-none-any.whl 3d2a69bdf04b7e9f3afa292c3bc7a98816bbfafa10bc9b45f3f3700d2f761620
httpcore2-2.16.2-py3-none-any.whl 16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a
httpx2-2.16.2-py3-none-any.whl f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5
ijson-3.6.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl c14d568d31a322e8ed7e9735f6e355608a23cc6ff4b5da843515089dae4cbf5f
jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 0956b5f58b804221dfb929c120e6d4032138fed20c1cc0ef683a2d1326255e46
jsonschema-4.26.0-py3-none-any.whl d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce
jsonschema_specifications-2025.9.1-py3-none-any.whl 98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe
loguru-0.7.3-py3-none-any.whl 31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c
mistral_common-1.13.1-py3-none-any.whl 98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af
msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b
openai-3.57.0-py3-none-any.whl f97bc74024c06ced8428b56c4a3594066709d3082779bf9d0b4b6092fbf587a8
openai_harmony-0.0.8-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl c007d277218a50db8839e599ed78e0fffe5130f614c3f6d93ae257f282071a29
partial_json_parser-0.2.1.1.post7-py3-none-any.whl 145119e5eabcf80cbb13844a6b50a85c68bf99d376f8ed771e2a3c3b03e653ae
pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl c212d02fd072c5845d39b4699eb65efa827b79a5cf7fecc9f468f8cad2b8540f
pycountry-26.2.16-py3-none-any.whl 115c4baf7cceaa30f59a4694d79483c9167dbce7a9de4d3d571c5f3ea77c305a
pydantic-2.14.4-py3-none-any.whl 653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc
pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d
pydantic_extra_types-2.11.1-py3-none-any.whl 1722ea2bddae5628ace25f2aa685b69978ef533123e5638cfbddb999e0100ec1
python_multipart-0.0.34-py3-none-any.whl ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91
pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl 858fe25231e0fd8612da142efde019faa5ef63fa150a821a27870e791b38c798
referencing-0.37.0-py3-none-any.whl 381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231
rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl addeda51556dac7c1a2f14cda62db8b621cd12afba3091d03a96c72932387eab
setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl 4a765e0c80a2453480be27c4fc22ba1c0771867040c5f91e4221940d78a4abfb
sniffio-1.3.1-py3-none-any.whl 2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2
starlette-1.10.0-py3-none-any.whl 478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4
truststore-0.10.5-py3-none-any.whl 9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c
typing_inspection-0.4.5-py3-none-any.whl bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39
xgrammar-0.2.9-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl 3326c9fb5864922fde7b52efea9c7e83b91a8f5bf81dbb5f5164d23410dfdae4
EOF
)"

# vLLM 0.34.0: the 0.29.0 set with vLLM's new exact pins (xgrammar==0.2.8,
# apache-tvm-ffi==0.1.11). Its other requirements are met by the same wheels (openai>=2.25,
# fastapi<0.137, starlette>=1.0.1, pydantic>=2.12, mistral_common>=1.13,
# compressed-tensors==0.17.0, llguidance<1.8; the openai_harmony module of openai-harmony).
# vLLM 0.34's module-level imports add no third-party package on the LLM(...) path (orjson:
# server and batch entry points only). Not checked on the host: tokenizers>=0.23.3 and
# huggingface_hub>=2.0.0 (vLLM 0.34's metadata; the host's own are used).
LOCK_0_34_0="$(cat <<'EOF'
vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl 79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2
xgrammar-0.2.8-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl 4045b096735bb2523e0d874039a55994c1b390620d547c4a0d4f43b9a106177b
apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl 2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128
llguidance-1.7.6-cp39-abi3-manylinux_2_31_x86_64.whl ceec951d29a74309984e3be0fe7f5f56c1362434cd937abd517b259a60908b1e
annotated_types-0.8.0-py3-none-any.whl f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0
blake3-1.0.11-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl 33424c686b291c7682b5816fe9320466dbc0a457ef7e15c273c804a2d70fea70
cachetools-8.0.2-py3-none-any.whl 502bf3c17c6e35d78ccdaa70da8c7001b28634541f5cde0dee33c93bb252277d
cbor2-6.3.0-cp312-cp312-manylinux_2_28_x86_64.whl 4f160b662059cc30ced4436fca332f4c27d0259698a5bde8373c9c6f829aabdf
compressed_tensors-0.17.0-py3-none-any.whl 4a1b89b508f7efb8ffb4eee8a6e69e0452d9b080cae130146025c64fbe9fa9aa
dnspython-2.9.2-py3-none-any.whl af15f7d385a6ae2fb35a796fde2138004c8c42c7389090e2addc83e3b3340fd8
email_validator-2.4.0-py3-none-any.whl 4454e41c4e1c6b6caee34a1dc71d5e736791562be8fd179b02e298f796522684
fastapi-0.136.3-py3-none-any.whl 3d2a69bdf04b7e9f3afa292c3bc7a98816bbfafa10bc9b45f3f3700d2f761620
httpcore2-2.16.2-py3-none-any.whl 16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a
httpx2-2.16.2-py3-none-any.whl f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5
ijson-3.6.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl c14d568d31a322e8ed7e9735f6e355608a23cc6ff4b5da843515089dae4cbf5f
jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 0956b5f58b804221dfb929c120e6d4032138fed20c1cc0ef683a2d1326255e46
jsonschema-4.26.0-py3-none-any.whl d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce
jsonschema_specifications-2025.9.1-py3-none-any.whl 98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe
loguru-0.7.3-py3-none-any.whl 31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c
mistral_common-1.13.1-py3-none-any.whl 98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af
msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b
openai-3.57.0-py3-none-any.whl f97bc74024c06ced8428b56c4a3594066709d3082779bf9d0b4b6092fbf587a8
openai_harmony-0.0.8-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl c007d277218a50db8839e599ed78e0fffe5130f614c3f6d93ae257f282071a29
partial_json_parser-0.2.1.1.post7-py3-none-any.whl 145119e5eabcf80cbb13844a6b50a85c68bf99d376f8ed771e2a3c3b03e653ae
pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl c212d02fd072c5845d39b4699eb65efa827b79a5cf7fecc9f468f8cad2b8540f
pycountry-26.2.16-py3-none-any.whl 115c4baf7cceaa30f59a4694d79483c9167dbce7a9de4d3d571c5f3ea77c305a
pydantic-2.14.4-py3-none-any.whl 653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc
pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d
pydantic_extra_types-2.11.1-py3-none-any.whl 1722ea2bddae5628ace25f2aa685b69978ef533123e5638cfbddb999e0100ec1
python_multipart-0.0.34-py3-none-any.whl ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91
pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl 858fe25231e0fd8612da142efde019faa5ef63fa150a821a27870e791b38c798
referencing-0.37.0-py3-none-any.whl 381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231
rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl addeda51556dac7c1a2f14cda62db8b621cd12afba3091d03a96c72932387eab
setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl 4a765e0c80a2453480be27c4fc22ba1c0771867040c5f91e4221940d78a4abfb
sniffio-1.3.1-py3-none-any.whl 2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2
starlette-1.10.0-py3-none-any.whl 478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4
truststore-0.10.5-py3-none-any.whl 9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c
typing_inspection-0.4.5-py3-none-any.whl bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39
EOF
)"
case "$VLLM_VERSION" in
  0.29.0) LOCK="$LOCK_0_29_0" ;;
  0.34.0) LOCK="$LOCK_0_34_0" ;;
  *) die "no LOCK list for vLLM $VLLM_VERSION (have: 0.29.0 0.34.0)" ;;
esac

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

REQ="$CACHE/requirements.txt"
: > "$REQ"
n_cached=0; n_missing=0
while read -r fname sha; do
  [ -n "$fname" ] || continue
  f="$WHL/$fname"
  if [ -f "$f" ] && [ "$(sha_of "$f")" = "$sha" ]; then
    n_cached=$((n_cached + 1)); continue
  fi
  rm -f "$f"
  name="${fname%%-*}"; rest="${fname#*-}"; ver="${rest%%-*}"
  echo "$name==$ver --hash=sha256:$sha" >> "$REQ"
  n_missing=$((n_missing + 1))
done <<< "$LOCK"
say "wheels: $n_cached cached, $n_missing to download"

if [ "$n_missing" -gt 0 ]; then
  # --require-hashes: pip only takes the exact files pinned above.
  plat=()
  for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 \
           manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    plat+=(--platform "${p}_x86_64")
  done
  "$PY" -m pip download --no-deps --only-binary=:all: --require-hashes \
      --python-version 3.12 --implementation cp "${plat[@]}" \
      --progress-bar off -d "$WHL" -r "$REQ" >&2 \
    || die "pip download failed (see above); nothing was built"
fi

missing=""
while read -r fname sha; do
  [ -n "$fname" ] || continue
  f="$WHL/$fname"
  if [ ! -f "$f" ]; then missing="$missing $fname(absent)";
  elif [ "$(sha_of "$f")" != "$sha" ]; then missing="$missing $fname(sha256-mismatch)"; fi
done <<< "$LOCK"
[ -z "$missing" ] || die "wheels missing after download:$missing"
say "all $(grep -c . <<< "$LOCK") pinned wheels present and verified"

# ---------------------------------------------------------------------------
# 2. Unpack + prune + pack.  Keyed on everything that shapes the archive,
#    so a rebuild with the same inputs reuses the last archive.
# ---------------------------------------------------------------------------
KEY="$( { echo "v4 vllm=$VLLM_VERSION sm=$SM moe=$WITH_MOE preset=$PRESET"; echo "$LOCK"; cat "$HERE/fatbin_prune.py" "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
ARCHIVE="$CACHE/archive-$KEY.tar.xz"

if [ -f "$ARCHIVE" ] && [ -f "$ARCHIVE.ok" ]; then
  say "reusing cached archive $ARCHIVE"
else
  rm -f "$CACHE"/archive-*.tar.xz "$CACHE"/archive-*.tar.xz.ok
  rm -rf "$WORK"
  SITE="$WORK/site"
  mkdir -p "$SITE"
  say "unpacking wheels into $SITE"
  WITH_MOE="$WITH_MOE" LOCK_TEXT="$LOCK" VLLM_VERSION="$VLLM_VERSION" \
  "$PY" - "$WHL" "$SITE" <<'PYEOF' || die "unpacking failed"
import fnmatch, os, sys, zipfile
whl_dir, site = sys.argv[1], sys.argv[2]
lock = [l.split()[0] for l in os.environ["LOCK_TEXT"].splitlines() if l.strip()]
with_moe = os.environ["WITH_MOE"] == "1"

# Left out of the vllm wheel (see README.md "What is left out").
DROP_VLLM = [
    "vllm/vllm-rs",                                   # Rust front-end binary
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",       # FlashAttention 2 (FA3 is used on Hopper)
    "vllm/_flashkda_C.abi3.so",
    "vllm/_flashmla_C.abi3.so",
    "vllm/_flashmla_extension_C.abi3.so",
]
if not with_moe:
    DROP_VLLM.append("vllm/_moe_C_stable_libtorch.abi3.so")  # fused-MoE CUDA ops
if os.environ["VLLM_VERSION"] != "0.29.0":  # 0.34.0
    DROP_VLLM += [
        "vllm/_deepselect_C.abi3.so",                 # DeepSeek sparse-attention top-k select
        "vllm/third_party/deep_gemm/_C_extension.abi3.so",  # DeepGEMM (FP8 GEMMs; none for bf16)
    ]
DROP_PREFIX_VERSION = {"0.29.0": []}.get(os.environ["VLLM_VERSION"], [
    "vllm/third_party/fmha_sm100/",                   # Blackwell-only attention kernels (sources)
])
DROP_GLOBS = ["*.h", "*.hpp", "*.cuh", "*.inl", "*.cu", "*.cpp"]  # C/C++/CUDA sources and headers
DROP_PREFIX = ["mistral_common/data/", "pycountry/locales/"]

def dropped(name):
    if name in DROP_VLLM or any(name.startswith(p) for p in DROP_PREFIX + DROP_PREFIX_VERSION):
        return True
    base = name.rsplit("/", 1)[-1]
    if name.startswith("vllm/"):
        if any(fnmatch.fnmatch(base, g) for g in DROP_GLOBS):
            return True
        # deep_gemm ships one _C per Python version; keep only CPython 3.12's
        if name.startswith("vllm/third_party/deep_gemm/_C.cpython-") and "cpython-312-" not in name:
            return True
    return False

owner = {}
n_files = n_drop = total = 0
for fname in lock:
    with zipfile.ZipFile(os.path.join(whl_dir, fname)) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/"):
                continue
            parts = name.split("/")
            if parts[0].endswith(".data"):          # wheel .data/ scheme folders
                if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                    name = "/".join(parts[2:])
                else:
                    n_drop += 1
                    continue
            if ".." in name.split("/") or name.startswith("/"):
                sys.exit(f"unsafe path {name!r} in {fname}")
            if dropped(name):
                n_drop += 1
                continue
            if name in owner:
                sys.exit(f"{name} is in both {owner[name]} and {fname}")
            owner[name] = fname
            dest = os.path.join(site, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    dst.write(b)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(dest, 0o755 if mode & 0o111 else 0o644)
            n_files += 1
            total += info.file_size
for must in ["vllm/__init__.py", "vllm/_C_stable_libtorch.abi3.so",
             "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "pydantic/__init__.py", "llguidance/__init__.py"]:
    if not os.path.exists(os.path.join(site, must)):
        sys.exit(f"expected file {must} is not in the unpacked tree")
print(f"build-bundle: unpacked {n_files} files ({total/1e6:.1f} MB), left out {n_drop}", file=sys.stderr)
PYEOF

  if [ "$SM" != all ]; then
    say "blanking GPU code that sm_$SM cannot run (fatbin_prune.py)"
    mapfile -t sos < <(find "$SITE/vllm" -name '*.so' | sort)
    "$PY" "$HERE/fatbin_prune.py" --sm "$SM" "${sos[@]}" >&2 || die "fatbin_prune failed"
  fi

  cat > "$SITE/vllm-bundle-info.txt" <<EOF
vLLM $VLLM_VERSION offline bundle (xz $PRESET)
gpu code kept for: $( [ "$SM" = all ] && echo "all architectures" || echo "sm_$SM only" )
fused-MoE CUDA ops (_moe_C): $( [ "$WITH_MOE" = 1 ] && echo kept || echo "left out" )
wheels:
$LOCK
EOF

  say "packing with xz $PRESET (threads: $THREADS); this takes a few minutes"
  t0=$(date +%s)
  ( cd "$SITE" && tar --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime='2026-01-01 00:00:00Z' --format=gnu -cf - . ) \
    | xz "$PRESET" -T"$THREADS" -c > "$ARCHIVE.tmp" || die "tar | xz failed"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  du -sb "$SITE" | cut -f1 > "$ARCHIVE.ok"
  say "packed in $(( $(date +%s) - t0 )) s"
  rm -rf "$WORK"
fi
UNPACKED_BYTES="$(cat "$ARCHIVE.ok")"

# ---------------------------------------------------------------------------
# 3. Split into parts and write install.sh.
# ---------------------------------------------------------------------------
BUNDLE_SHA="$(sha_of "$ARCHIVE")"
BUNDLE_ID="${BUNDLE_SHA:0:12}"
PREFIX="vllm-bundle-$BUNDLE_ID.tar.xz"
rm -f "$OUT"/vllm-bundle-*.tar.xz.[0-9][0-9] "$OUT/install.sh"
split -b "$PART_SIZE" -d -a 2 "$ARCHIVE" "$OUT/$PREFIX."

PARTS=""
for f in "$OUT/$PREFIX".[0-9][0-9]; do
  PARTS="$PARTS$(basename "$f") $(stat -c %s "$f") $(sha_of "$f")"$'\n'
done
NPARTS="$(grep -c . <<< "$PARTS")"

[ -f "$HERE/install-template.sh" ] || die "install-template.sh is missing next to build-bundle.sh"
BUNDLE_ID="$BUNDLE_ID" BUNDLE_SHA="$BUNDLE_SHA" VLLM_VERSION="$VLLM_VERSION" PARTS="$PARTS" \
UNPACKED_BYTES="$UNPACKED_BYTES" SM="$SM" WITH_MOE="$WITH_MOE" \
"$PY" - "$HERE/install-template.sh" "$OUT/install.sh" <<'PYEOF' || die "writing install.sh failed"
import os, sys
src, dst = sys.argv[1], sys.argv[2]
t = open(src).read()
subs = {
    "@BUNDLE_ID@": os.environ["BUNDLE_ID"],
    "@BUNDLE_SHA@": os.environ["BUNDLE_SHA"],
    "@VLLM_VERSION@": os.environ["VLLM_VERSION"],
    "@UNPACKED_BYTES@": os.environ["UNPACKED_BYTES"],
    "@GPU_ARCH@": "all" if os.environ["SM"] == "all" else "sm_" + os.environ["SM"],
    "@WITH_MOE@": os.environ["WITH_MOE"],
    "@PARTS@": os.environ["PARTS"].rstrip("\n"),
}
for k, v in subs.items():
    if k not in t:
        sys.exit(f"placeholder {k} not in template")
    t = t.replace(k, v)
open(dst, "w").write(t)
os.chmod(dst, 0o755)
PYEOF

# ---------------------------------------------------------------------------
# 4. Report.
# ---------------------------------------------------------------------------
echo "build-bundle: done in $(( $(date +%s) - T_START )) s"
echo "  bundle id        $BUNDLE_ID  (vLLM $VLLM_VERSION, gpu code: $( [ "$SM" = all ] && echo all || echo "sm_$SM"), moe ops: $( [ "$WITH_MOE" = 1 ] && echo yes || echo no))"
echo "  archive          $(stat -c %s "$ARCHIVE") bytes (unpacks to $UNPACKED_BYTES bytes)"
echo "  parts            $NPARTS (limit $PART_SIZE bytes each)"
while read -r name size sha; do
  [ -n "$name" ] || continue
  printf '    %-40s %12s bytes\n' "$name" "$size"
done <<< "$PARTS"
printf '    %-40s %12s bytes\n' install.sh "$(stat -c %s "$OUT/install.sh")"
echo "  next             copy $OUT/install.sh and the part(s) to the GPU host, then there:"
echo "                     eval \"\$(bash install.sh)\" && python3 -c 'import vllm; print(vllm.__version__)'"
