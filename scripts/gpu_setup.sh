#!/usr/bin/env bash
# A fresh checkout's GPU kit, made here (no GPU), all of it git-ignored and carried by the device
# calls (carry [".whl", ".anchors", ".ab", ".cubin.tar.xz"], ~30 MB): the wheels the GPU machines
# lack (.whl/: nvmath-python for cuBLAS, gguf for the models), the anchors kit (.anchors/: llama.cpp's
# tree, the twin generator, the tokenizer metadata), main's gg for A/Bs (.ab/old) and the kernels
# compiled by the machines' NVRTC (.cubin.tar.xz, scripts/cubin_pack.sh, ~13 min with the CONSTS
# variants: in the background, log in /tmp/cubin_pack.log). None of it survives into the next
# session's checkout: run this first.
#   bash scripts/gpu_setup.sh [REV for .ab/old, default main]
set -eu
cd "$(dirname "$0")/.."
# the pack's NVRTC venv sees this Python's packages: without cuda-bindings it compiles nothing
python3 -c "import cuda.bindings" 2> /dev/null || { echo "gpu_setup: pip install -e '.[test]' first (cuda-bindings)"; exit 1; }
mkdir -p .git/info; grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.anchors/\n/.ab/\n' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl nvmath-python==1.0.0 gguf==0.19.0
rm -rf .anchors && cp -r ../shared/anchors .anchors
rm -rf .ab/old && mkdir -p .ab/old && git archive "${1:-main}" gg | tar -x -C .ab/old
echo "kit: $(ls .whl | tr '\n' ' '); .anchors; .ab/old = ${1:-main}"
CONSTS=${CONSTS-"blocks.MVS_RELEASE=1 blocks.MVS_BLOCKS_SM=6 blocks.MVS_THREADS=256"} PACK_CACHE=${PACK_CACHE-/tmp/gg-pack-cache} \
    nohup bash scripts/cubin_pack.sh sm_90 > /tmp/cubin_pack.log 2>&1 < /dev/null &
echo "cubin pack building in the background: tail -1 /tmp/cubin_pack.log"
