# Sourced by the GPU scripts: install wheels carried to the device machine in .whl/ (there,
# nvmath-python for cuBLAS: the device tool's README says how to download them) into /tmp/site
# and put it on PYTHONPATH. Does nothing when there are none.
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
