#!/usr/bin/env bash
# Every kernel of this tree (and of each REV given: e.g. main's, for an A/B of an experiment branch
# against it on the device, .ab/old) compiled here for ARCH (NVRTC needs no GPU), packed for the
# device machine: carry .cubin.tar.xz (about 6 MB) and scripts/gpu_env.sh unpacks it into gg's
# disk cache there, so a fresh machine starts without minutes of NVRTC compiles. An entry's key is
# the sha256 of its source, options, arch and NVRTC version (gg/backends/cuda/compiler.py): where
# the device's NVRTC or a kernel source differs, that entry is simply not used.
# NVRTC=X.Y (default 13.0, the H200 machines' as scripts/gpu_env.sh reported it in the nineteenth
# session; their first session's pack by this machine's 13.5 served nothing) compiles with that
# NVRTC from a throwaway venv (nvidia-cuda-nvrtc==X.Y.* from pip); NVRTC= uses this machine's.
# CONSTS="blocks.MVS_BLOCKS_SM=6 blocks.MVS_THREADS=256": this tree's kernels also with each of
# those constants (scripts/plan_consts.py, as scripts/model_steps.py --const sets them), so an A/B of
# them on the device compiles nothing either; "A=1,B=2" is one variant with both.
#   [NVRTC=X.Y] [CONSTS="FAMILY.NAME=N ..."] bash scripts/cubin_pack.sh [ARCH [REV...]]
set -eu
cd "$(dirname "$0")/.."
root=$PWD
NVRTC=${NVRTC-13.0}
if [ -n "$NVRTC" ]; then
    venv=/tmp/gg-nvrtc-$NVRTC
    [ -x "$venv/bin/python3" ] || { python3 -m venv --system-site-packages "$venv" &&
        "$venv/bin/python3" -m pip install -q "nvidia-cuda-nvrtc==$NVRTC.*"; }
    export PATH="$venv/bin:$PATH"
fi
arch=${1:-sm_90}; shift || true
if [ -n "${PACK_CACHE:-}" ]; then  # PACK_CACHE=DIR: a cache kept between runs (a rerun after an edit
    tmp=$PACK_CACHE; mkdir -p "$tmp"   # compiles only what changed; the pack holds the stale entries too)
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
fi
GG_CACHE_DIR="$tmp" python3 -m gg kernels --arch "$arch" | tail -1
for c in ${CONSTS:-}; do  # the kernels whose defines it changes add entries
    GG_CACHE_DIR="$tmp" python3 -c "import sys; sys.path.insert(0, 'scripts'); import plan_consts
plan_consts.apply('$c'.split(',')); from gg.__main__ import main; sys.exit(main(['kernels', '--arch', '$arch', '-q']))" | tail -1 | sed "s|^|$c: |"
done
# the cache entries of the tree in the current directory (with each CONSTS variant: $1)
keys() {
    for c in "" $1; do python3 -c "import sys; sys.path.insert(0, '$root/scripts'); import plan_consts
from gg.backends.cuda import catalog, compiler
plan_consts.apply('$c'.split(',') if '$c' else [])
for f in catalog.files():
    print('cubin/%s.cubin' % compiler.cache_key(compiler.source(f), compiler._headers(), compiler.OPTIONS + compiler.defines(f), '$arch'))"
    done
}
: > "$tmp/keep.revs"
for rev in "$@"; do  # a tree's kernels that differ from this one's add entries (kept: an A/B of the
    # trees on the device compiles nothing); the rest are hits
    mkdir -p "$tmp/tree" && git archive "$rev" gg | tar -x -C "$tmp/tree"
    (cd "$tmp/tree" && GG_CACHE_DIR="$tmp" python3 -m gg kernels --arch "$arch" | tail -1 | sed "s|^|$rev: |"
     keys "" >> "$tmp/keep.revs")
    rm -rf "$tmp/tree"
done
python3 -c "from gg.backends.cuda import compiler; print('%d.%d' % compiler.nvrtc_version())" > "$tmp/nvrtc-version"
# only the entries of this tree (with each CONSTS variant) and of the REVs: a kept PACK_CACHE also
# holds every earlier edit's, which would make the pack slow to write and too big to carry
{ keys "${CONSTS:-}"; cat "$tmp/keep.revs"; } > "$tmp/keep"
# written aside and renamed: a device call started meanwhile carries the last whole pack, not a cut one
(cd "$tmp" && sort -u keep | while read -r e; do [ -f "$e" ] && echo "$e"; done > keep.present)
tar -C "$tmp" -cJf .cubin.tar.xz.part -T "$tmp/keep.present" nvrtc-version && mv .cubin.tar.xz.part .cubin.tar.xz
echo "wrote .cubin.tar.xz: $(wc -l < "$tmp/keep.present") CUBINs by NVRTC $(cat "$tmp/nvrtc-version"), $(du -h .cubin.tar.xz | cut -f1)"
