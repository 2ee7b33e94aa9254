# Sourced by the GPU scripts from the repository root: wheels carried to the device machine in
# .whl/ (nvmath-python for cuBLAS is not installed there; the device tool's README says how to
# download them) go into /tmp/site, which joins PYTHONPATH with the repository itself.
# Installed once a machine (a second script running beside the first must not reinstall under it).
if ls .whl/*.whl > /dev/null 2>&1; then
    [ -f /tmp/site/.gg-installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.gg-installed; }
    [ -f /tmp/site/.gg-installed ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}.
# CUBINs compiled off the device (scripts/cubin_pack.sh) into gg's disk cache, once a machine
if [ -f .cubin.tar.xz ] && [ ! -f /tmp/.gg-cubins ]; then
    d=${GG_CACHE_DIR:-$HOME/.cache/gg}; mkdir -p "$d" && tar -xJf .cubin.tar.xz -C "$d" && touch /tmp/.gg-cubins
    echo "cubin pack: built by NVRTC $(cat "$d/nvrtc-version" 2>/dev/null), this machine's is $(python3 -c "from gg.backends.cuda \
import compiler; print('%d.%d' % compiler.nvrtc_version())" 2>/dev/null) (its entries serve only if they match)" >&2
fi
export PYTHONUNBUFFERED=1
