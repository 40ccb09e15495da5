#!/usr/bin/env bash
# The structured-output backends vLLM 0.34 imports that the offline bundle lacks, for the GPU host
# (Python 3.12, x86_64): lm-format-enforcer 0.11.3 (vLLM 0.34 pins it; its validation imports it
# for every JSON-schema request, so without it every batch holding a structured-output request
# fails with "No module named 'lmformatenforcer'"), interegular, lark 1.2.2, outlines_core 0.2.14.
#
#   bash scripts/bundle/fetch_extras.sh .bundle     # writes .bundle/extras.tar.xz (about 1.8 MB)
#
# On the host: scripts/gpu_hunt.sh (and any command) unpacks it into /tmp/extras and puts that
# on PYTHONPATH when .bundle/extras.tar.xz is carried:
#   mkdir -p /tmp/extras && tar xJf .bundle/extras.tar.xz -C /tmp/extras \
#     && export PYTHONPATH=/tmp/extras${PYTHONPATH:+:$PYTHONPATH}
set -euo pipefail
OUT=${1:?usage: fetch_extras.sh OUTDIR}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/req.txt" <<'REQ'
interegular==0.3.3 --hash=sha256:b0c07007d48c89d6d19f7204972d369b2a77222722e126b6aa63aa721dc3b19c
lark==1.2.2 --hash=sha256:c2276486b02f0f1b90be155f2c8ba4a8e194d42775786db622faccd652d8e80c
lm-format-enforcer==0.11.3 --hash=sha256:cf586350875def1ae7a8fba84fcbbfc8371424b6c9d05c1fcba70aa233fbf06f
outlines_core==0.2.14 --hash=sha256:3bb2060c240c4507f334965a8948dbeeb22007560d797f6debd92346c0b620cb
REQ
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --require-hashes \
  -r "$W/req.txt" -d "$W/wheels"
mkdir -p "$W/site" "$OUT"
for w in "$W"/wheels/*.whl; do python3 -m zipfile -e "$w" "$W/site"; done
tar cJf "$OUT/extras.tar.xz" -C "$W/site" .
ls -l "$OUT/extras.tar.xz"
