#!/usr/bin/env bash
# Every kernel of this tree compiled for sm_90 here (NVRTC needs no GPU), packed for the device
# machine: carry .cubin.tar.xz (about 6 MB) and scripts/gpu_env.sh unpacks it into gg's disk cache
# there, so a fresh machine starts without the ~3 minutes of NVRTC compiles. An entry's key is the
# sha256 of its source, options, arch and NVRTC version (gg/backends/cuda/compiler.py): where the
# device's NVRTC or a kernel source differs, that entry is simply not used.
#   bash scripts/cubin_pack.sh [ARCH]
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GG_CACHE_DIR="$tmp" python3 -m gg kernels --arch "${1:-sm_90}" | tail -1
tar -C "$tmp" -cJf .cubin.tar.xz cubin
echo "wrote .cubin.tar.xz: $(ls "$tmp"/cubin | wc -l) CUBINs, $(du -h .cubin.tar.xz | cut -f1)"
