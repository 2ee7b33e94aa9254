#!/usr/bin/env bash
# This session's GPU work in two calls on one warm machine (the second within 30 s of the first):
#   bash scripts/gpu_session.sh tests    build llama.cpp in the background (setsid; needs .anchors/
#                                        carried: the anchors kit), run the quant/argmax/interop cuda
#                                        tests, the fuzzer (GG_FUZZ_EXAMPLES, default 2000) and
#                                        bench_quant
#   bash scripts/gpu_session.sh models   wait for the build, write the SmolLM2-dims twins (F16 ->
#                                        Q4_1, Q8_0), bench gg and llama.cpp on them side by side
# Logs to $OUT.
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/gg-session}; mkdir -p "$OUT"
B=/tmp/lcpp/build/bin; W=/tmp/anchor_work
case "${1:-}" in
tests)
    if [ ! -x $B/llama-bench ] && [ -f .anchors/llama.cpp.tgz ]; then
        mkdir -p /tmp/lcpp && tar xzf .anchors/llama.cpp.tgz -C /tmp/lcpp
        setsid bash -c "cmake -S /tmp/lcpp -B /tmp/lcpp/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lcpp_cmake.log 2>&1 && \
            nice cmake --build /tmp/lcpp/build -j12 --target llama-bench llama-quantize > /tmp/lcpp_build.log 2>&1; \
            echo done > /tmp/lcpp_done" < /dev/null > /dev/null 2>&1 &
    fi
    [ -n "${NO_NEW:-}" ] || python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_quant_ops.py tests/test_argmax.py \
        tests/test_interop.py tests/test_values.py 2>&1 | tail -5 | tee "$OUT/pytest_new.log"
    GG_FUZZ_PROGRESS=1 GG_FUZZ_EXAMPLES=${GG_FUZZ_EXAMPLES:-2000} timeout ${FUZZ_TIMEOUT:-420} python3 -m pytest -m cuda -q -s \
        -p no:cacheprovider tests/test_fuzz.py > "$OUT/fuzz_cuda.log" 2>&1; echo "fuzz exit $?"; tail -4 "$OUT/fuzz_cuda.log"
    [ -n "${NO_BENCH:-}" ] || timeout 150 python3 bench/bench_quant.py 2>&1 | tee "$OUT/bench_quant.log" | grep -E "^mul_mat|^gg"
    cp /tmp/lcpp_cmake.log /tmp/lcpp_build.log "$OUT/" 2>/dev/null; tail -3 /tmp/lcpp_cmake.log /tmp/lcpp_build.log 2>/dev/null
    ;;
models)
    for _ in $(seq 1 60); do [ -f /tmp/lcpp_done ] && break; sleep 5; done
    tail -3 /tmp/lcpp_build.log; mkdir -p $W
    python3 .anchors/gen_gguf.py --dims smol --out $W/smol-F16.gguf --tok .anchors/smol_tok_meta.json > /dev/null
    for q in Q4_1 Q8_0; do $B/llama-quantize $W/smol-F16.gguf $W/smol-$q.gguf $q 16 > /dev/null 2>&1; done
    ls -la $W
    python3 bench/bench_models.py $W/smol-F16.gguf $W/smol-Q8_0.gguf $W/smol-Q4_1.gguf \
        $( [ -x $B/llama-bench ] && echo --llama-bench $B/llama-bench ) 2>&1 | tee "$OUT/bench_models.log"
    ;;
*) echo "usage: gpu_session.sh tests|models"; exit 2 ;;
esac
