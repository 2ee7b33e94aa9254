#!/usr/bin/env bash
# One device call of the development loop: carried wheels (nvmath-python) installed, the named
# test files first (-x, quick feedback), then the whole CUDA suite, then the attention benchmark
# (MHA and GQA 32/8, decode + prefill, with the per-step profile). Logs go to $OUT.
#   TESTS="tests/test_flash.py ..."  BENCH_ARGS="--no-compile"  SKIP_SUITE=1  SKIP_BENCH=1
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gg-dev}
mkdir -p "$OUT"
. scripts/gpu_env.sh
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
if [ -n "${TESTS:-}" ]; then
    python3 -m pytest -q -x -p no:cacheprovider -m cuda $TESTS 2>&1 | tee "$OUT/tests.log" | tail -n 25
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -z "${SKIP_SUITE:-}" ]; then
    python3 -m pytest -q -p no:cacheprovider -m cuda tests 2>&1 | tee "$OUT/cuda_suite.log" | tail -n 8
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    python3 bench/bench_attention.py --only decode,prefill --profile ${BENCH_ARGS:-} \
        --json "$OUT/attn.json" 2>&1 | tee "$OUT/attn.log" | tail -n 60 || status=1
    python3 bench/bench_attention.py --only decode,prefill --profile --n-head-kv 8 ${BENCH_ARGS:-} \
        --json "$OUT/attn_gqa8.json" 2>&1 | tee "$OUT/attn_gqa8.log" | tail -n 60 || status=1
fi
exit $status
