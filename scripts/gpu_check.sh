#!/usr/bin/env bash
# The CUDA backend's GPU check: the cuda-marked tests, then the same under compute-sanitizer
# (memcheck on everything, racecheck on the kernels with shared-memory reductions, initcheck on
# the op and llama suites).
# Logs go to $OUT (or ./gpu_check_logs). Exit status: non-zero if any part failed.
set -u
OUT=${OUT:-gpu_check_logs}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_env.sh"   # PYTHONPATH, and nvmath-python (cuBLAS) from carried wheels
status=0

python3 -m pytest -m cuda -q -p no:cacheprovider tests/ 2>&1 | tee "$OUT/pytest_cuda.log" || true
grep -qE "^[0-9]+ passed" "$OUT/pytest_cuda.log" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/pytest_cuda.log" || status=1

SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# memcheck runs the real path (CUDA graphs on); racecheck launches kernels one by one.
timeout ${SAN_TIMEOUT:-600} "$SAN" --tool memcheck --leak-check no --error-exitcode 99 --log-file "$OUT/memcheck.log" \
    python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda.py tests/test_flash.py tests/test_matvec_add.py \
    tests/test_kernel_paths.py tests/test_branches.py tests/test_llama.py tests/test_epilogue.py -k "not out_of_memory" > "$OUT/memcheck_pytest.log" 2>&1
rc=$?; echo "memcheck exit $rc" | tee -a "$OUT/memcheck_pytest.log"; [ $rc -eq 0 ] || status=1

GG_NO_CUDA_GRAPH=1 timeout ${SAN_TIMEOUT:-600} "$SAN" --tool racecheck --error-exitcode 99 --log-file "$OUT/racecheck.log" \
    python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda.py tests/test_flash.py tests/test_kernel_paths.py \
    -k "(norm or soft_max or softmax or (mul_mat and not cublas) or matvec or attention or flash) and not gemm_operand" \
    > "$OUT/racecheck_pytest.log" 2>&1
rc=$?; echo "racecheck exit $rc" | tee -a "$OUT/racecheck_pytest.log"; [ $rc -eq 0 ] || status=1

# initcheck: no kernel reads device memory nobody wrote (arenas are not zeroed). The large cuBLAS
# GEMM is left out: initcheck does not see the writes of the Hopper GEMM kernel cuBLAS picks
# there (every byte of its correct output is reported uninitialized when read back). So is
# test_rms_norm_writes_the_gemm_operand (and from racecheck): its GEMM (K = 4096, small M and N)
# makes cuBLAS pick split-K kernels, whose own shared memory racecheck flags and whose reduce
# kernel reads parts of cuBLAS's workspace it did not write (every report is inside cuBLAS;
# memcheck is clean).
GG_NO_CUDA_GRAPH=1 timeout ${SAN_TIMEOUT:-600} "$SAN" --tool initcheck --error-exitcode 99 --log-file "$OUT/initcheck.log" \
    python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda.py tests/test_llama.py tests/test_flash.py tests/test_matvec_add.py \
    tests/test_kernel_paths.py tests/test_epilogue.py -k "not out_of_memory and not cublas_large and not gemm_operand" > "$OUT/initcheck_pytest.log" 2>&1
rc=$?; echo "initcheck exit $rc" | tee -a "$OUT/initcheck_pytest.log"; [ $rc -eq 0 ] || status=1

# The sanitizer must catch a planted out-of-bounds write made through gg's launch path.
timeout 120 "$SAN" --tool memcheck --error-exitcode 99 python3 scripts/sanitizer_selftest.py \
    > "$OUT/sanitizer_selftest.log" 2>&1
rc=$?; echo "planted fault: memcheck exit $rc (99 expected)" | tee -a "$OUT/sanitizer_selftest.log"
[ $rc -eq 99 ] || status=1

tail -n 3 "$OUT"/*.log
exit $status
