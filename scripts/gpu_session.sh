#!/usr/bin/env bash
# A session's GPU work in three calls on one warm machine (each within 30 s of the one before), logs
# to $OUT:
#   bash scripts/gpu_session.sh tests   start llama.cpp's build in the background (needs .anchors/
#                                       carried: the anchors kit), then every cuda and compile_all
#                                       test (TESTS="files / pytest options": some), the layer split on
#                                       two logical devices and the HF parity tests (transformers;
#                                       TESTS_ONLY=1: not these two); PAR="files|files": groups run
#                                       as concurrent pytest processes
#   bash scripts/gpu_session.sh checks  RERUN="tests..." reruns cuda tests, memcheck on the newest
#                                       suites (SAN_TESTS, SAN_K: a -k expression), the fuzzer (GG_FUZZ_EXAMPLES, default 1000;
#                                       FUZZ_TIMEOUT)
#   bash scripts/gpu_session.sh bench   bench_forms, bench_split (two logical devices), memcheck of
#                                       SAN_TESTS if given
#   bash scripts/gpu_session.sh lcpp    start llama.cpp's build in the background and return
#   bash scripts/gpu_session.sh models  once the build is done: the SmolLM2-dims twins benched by gg
#                                       and llama.cpp side by side
#   bash scripts/gpu_session.sh models8b  the same for llama-3-8B dims (F16, Q8_0, Q4_0; QUANTS=, NO_F16=1)
#                                       (both: GG_CONSTS="FAMILY.NAME=N ...": gg with those switches set)
#   bash scripts/gpu_session.sh abbench `gg bench` of one file (AB_FILE) by each tree in AB_TREES (this one,
#                                       .ab/old), twice, alternating (AB_ARGS, default "-p 512 -n 0 -r 5")
#   bash scripts/gpu_session.sh twin    a whole decode token replayed on 4-layer llama-3-8B-dims twins
#                                       (scripts/quant_twin.py, no llama.cpp; TWIN="q4_0 q8_0"; TWIN_HEAD=q6_k:
#                                       the head as llama-quantize's Q4_0 files have it), by the trees in TREES (this
#                                       one, .ab/old if carried: git archive OLD gg | tar -x -C .ab/old);
#                                       STEPS=1: each step of layer 1 too (scripts/model_steps.py);
#                                       FLAGS="--no-stream;--no-epilogue": this tree with those switches (ROUNDS=N:
#                                       N rounds of them, alternating);
#                                       TRACE=1: per-kernel times and gaps of the replay (TRACE_FLAGS="a;b": also with
#                                       each of those; TRACE_BASE: switches every trace takes, e.g. "--n-ctx 128");
#                                       AFTER_PREP=1: first wait (up to 4 min) for a `prep` of the same call
#   bash scripts/gpu_session.sh prep    the twin mode in the background (files, compiled kernels), to warm up
#                                       while the same call runs tests
#   bash scripts/gpu_session.sh ncu     Nsight Compute sections (speed of light, occupancy, warp states,
#                                       memory) of one decode token's kernels on a twin (TWIN=, TWIN_DIMS=, NCU_K=;
#                                       NCU_METRICS: more metrics, e.g. the stall reasons)
# NO_FUZZ=1 / NO_SAN=1 / NO_LCPP=1 leave those parts out. Carry .cubin.tar.xz (scripts/cubin_pack.sh, made
# here without a GPU) with .whl/ and .anchors/: scripts/gpu_env.sh puts its kernels into gg's disk cache.
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
OUT=${OUT:-/tmp/gg-session}; mkdir -p "$OUT"
B=/tmp/lcpp/build/bin; W=/tmp/anchor_work
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
build_llamacpp() {  # in the background: llama-bench and llama-quantize (~4.5 min on 16 cores)
    if [ -z "${NO_LCPP:-}" ] && [ ! -x $B/llama-bench ] && [ -f .anchors/llama.cpp.tgz ]; then
        mkdir -p /tmp/lcpp && tar xzf .anchors/llama.cpp.tgz -C /tmp/lcpp
        setsid bash -c "cmake -S /tmp/lcpp -B /tmp/lcpp/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lcpp_cmake.log 2>&1 && \
            nice cmake --build /tmp/lcpp/build -j14 --target llama-bench llama-quantize > /tmp/lcpp_build.log 2>&1; \
            echo done > /tmp/lcpp_done" < /dev/null > /dev/null 2>&1 &
    fi
}
case "${1:-}" in
lcpp)  # only llama.cpp's build, in the background: a later `models` of the same call finds it done or under way
    build_llamacpp
    ;;
tests)
    build_llamacpp
    if [ -n "${PAR:-}" ]; then  # PAR="files|files|...": those groups as concurrent pytest processes (one GPU, 16 cores)
        IFS='|' read -ra groups <<< "$PAR"; i=0
        for g in "${groups[@]}"; do i=$((i+1))
            timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -m "cuda or compile_all" -q -p no:cacheprovider $g > "$OUT/pytest_cuda_$i.log" 2>&1 &
        done; wait
        for j in $(seq 1 $i); do echo "group $j: $(tail -1 "$OUT/pytest_cuda_$j.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda_$j.log" | head -20; done
    else
        timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -m "cuda or compile_all" -q -p no:cacheprovider ${TESTS:-tests/} > "$OUT/pytest_cuda.log" 2>&1
        tail -15 "$OUT/pytest_cuda.log"
    fi
    for f in "$OUT"/pytest_cuda*.log; do  # a group cut by its time limit ends in progress dots only
        p=$(grep -E '^[.FEsx]+( +\[ *[0-9]+%\])?$' "$f" | tr -d -c '.FEsx')  # the progress characters
        grep -q " in [0-9.]*s" "$f" || echo "$(basename "$f"): cut by the time limit after $(tr -d -c . <<< "$p" | wc -c) passed, $(tr -d -c FE <<< "$p" | wc -c) failed or errors"
    done
    [ -n "${TESTS_ONLY:-}" ] && exit 0
    GG_CUDA_DEVICES=0,0 timeout 60 python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_devices.py 2>&1 | tail -3 | tee "$OUT/pytest_devices.log"
    timeout 90 python3 -m pytest -m model -q -p no:cacheprovider tests/test_hf_parity.py 2>&1 | tail -6 | tee "$OUT/pytest_hf.log"
    ;;
checks)
    build_llamacpp
    [ -z "${RERUN:-}" ] || timeout ${RERUN_TIMEOUT:-120} python3 -m pytest -m cuda -q -p no:cacheprovider $RERUN 2>&1 | tail -3 | tee "$OUT/pytest_rerun.log"
    if [ -z "${NO_SAN:-}" ]; then
        GG_CUDA_DEVICES=0,0 timeout ${SAN_TIMEOUT:-240} "$SAN" --tool memcheck --leak-check no --error-exitcode 99 --log-file "$OUT/memcheck.log" \
            python3 -m pytest -m cuda -q -p no:cacheprovider ${SAN_K:+-k "$SAN_K"} ${SAN_TESTS:-tests/test_siblings.py tests/test_sibling_epilogue.py \
            tests/test_elide.py tests/test_epilogue.py tests/test_devices.py} > "$OUT/memcheck_pytest.log" 2>&1
        echo "memcheck exit $? (0: clean)"; tail -2 "$OUT/memcheck_pytest.log"
    fi
    if [ -z "${NO_FUZZ:-}" ]; then
        GG_FUZZ_PROGRESS=1 GG_FUZZ_EXAMPLES=${GG_FUZZ_EXAMPLES:-1000} timeout ${FUZZ_TIMEOUT:-200} python3 -m pytest -m cuda -q -s \
            -p no:cacheprovider tests/test_fuzz.py -k cuda > "$OUT/fuzz_cuda.log" 2>&1; echo "fuzz exit $?"; tail -3 "$OUT/fuzz_cuda.log"
    fi
    cp /tmp/lcpp_cmake.log /tmp/lcpp_build.log "$OUT/" 2>/dev/null; tail -2 /tmp/lcpp_build.log 2>/dev/null
    ;;
bench)
    build_llamacpp
    timeout 240 python3 bench/bench_forms.py --json "$OUT/forms.json" 2>&1 | tee "$OUT/bench_forms.log" | tail -40
    GG_CUDA_DEVICES=0,0 timeout 150 python3 bench/bench_split.py --json "$OUT/split.json" 2>&1 | tee "$OUT/bench_split.log"
    [ -z "${SAN_TESTS:-}" ] || { timeout 150 "$SAN" --tool memcheck --leak-check no --error-exitcode 99 \
        --log-file "$OUT/memcheck2.log" python3 -m pytest -m cuda -q -p no:cacheprovider $SAN_TESTS 2>&1 | tail -2;
        echo "memcheck exit ${PIPESTATUS[0]}"; }
    ;;
models8b)   # the llama-3-8B-dims files (F16, and Q8_0 / Q4_0 by llama-quantize), gg and llama.cpp side by side
    build_llamacpp
    mkdir -p $W
    [ -f $W/8b-F16.gguf ] || python3 .anchors/gen_gguf.py --dims 8b --out $W/8b-F16.gguf --tok .anchors/smol_tok_meta.json | tail -1
    for _ in $(seq 1 90); do [ -f /tmp/lcpp_done ] && break; sleep 5; done
    tail -2 /tmp/lcpp_build.log
    for q in ${QUANTS:-Q8_0 Q4_0}; do [ -f $W/8b-$q.gguf ] || $B/llama-quantize $W/8b-F16.gguf $W/8b-$q.gguf $q 16 > /dev/null 2>&1; done
    python3 bench/bench_models.py $( [ -z "${NO_F16:-}" ] && echo $W/8b-F16.gguf ) $(for q in ${QUANTS:-Q8_0 Q4_0}; do echo $W/8b-$q.gguf; done) \
        $( [ -x $B/llama-bench ] && echo --llama-bench $B/llama-bench ) $(for c in ${GG_CONSTS:-}; do echo --const $c; done) \
        2>&1 | tee "$OUT/bench_models_8b.log"
    ;;
models)
    build_llamacpp
    [ -z "${RERUN:-}" ] || timeout 200 python3 -m pytest -m cuda -q -p no:cacheprovider $RERUN 2>&1 | tail -3 | tee "$OUT/pytest_rerun.log"
    for _ in $(seq 1 90); do [ -f /tmp/lcpp_done ] && break; sleep 5; done
    tail -3 /tmp/lcpp_build.log; mkdir -p $W
    python3 .anchors/gen_gguf.py --dims smol --out $W/smol-F16.gguf --tok .anchors/smol_tok_meta.json > /dev/null
    for q in Q4_1 Q8_0; do $B/llama-quantize $W/smol-F16.gguf $W/smol-$q.gguf $q 16 > /dev/null 2>&1; done
    python3 bench/bench_models.py $W/smol-F16.gguf $W/smol-Q8_0.gguf $W/smol-Q4_1.gguf \
        $( [ -x $B/llama-bench ] && echo --llama-bench $B/llama-bench ) $(for c in ${GG_CONSTS:-}; do echo --const $c; done) \
        2>&1 | tee "$OUT/bench_models.log"
    ;;
abbench)  # `gg bench` of one file by each tree, alternating (AB_FILE=8b-F16 of models8b's files or a path;
    # AB_TREES=". .ab/old"; AB_ARGS="-p 512 -n 0 -r 5"): python -m gg takes the gg of the directory it runs in
    mkdir -p $W
    F=${AB_FILE:-8b-F16}; case "$F" in */*|*.gguf) ;; *) F=$W/$F.gguf ;; esac  # a name of models8b's files, or a path
    [ -f "$F" ] || [ "$F" != $W/8b-F16.gguf ] || python3 .anchors/gen_gguf.py --dims 8b --out $F --tok .anchors/smol_tok_meta.json | tail -1
    [ -f "$F" ] || { echo "abbench: no file $F (models8b / models make the quantized ones)"; exit 1; }
    for rep in 1 2; do for tree in ${AB_TREES:-. .ab/old}; do
        [ -d $tree/gg ] && echo "$tree: $(cd $tree && timeout ${AB_TIMEOUT:-120} python3 -m gg bench "$F" ${AB_ARGS:--p 512 -n 0 -r 5} 2>&1 | grep -E '^\| *[a-z0-9]' | grep -v model | tr '\n' ' ')"
    done; done 2>&1 | tee "$OUT/abbench.log"
    ;;
twin)
    [ -z "${AFTER_PREP:-}" ] || for _ in $(seq 1 120); do [ -f /tmp/prep_done ] && break; sleep 2; done
    mkdir -p $W
    T=$W/${TWIN_DIMS:=8b}${TWIN_LAYERS:=4}  # TWIN_DIMS=smol TWIN_LAYERS=30: SmolLM2-135M dims
    [ -f $T-F16.gguf ] || python3 .anchors/gen_gguf.py --dims $TWIN_DIMS --layers $TWIN_LAYERS --out $T-F16.gguf \
        --tok .anchors/smol_tok_meta.json > /dev/null
    for q in ${TWIN:-q4_0 q8_0}; do
        H=${TWIN_HEAD:+-$TWIN_HEAD}  # TWIN_HEAD=q6_k: output.weight of that type (llama-quantize's Q4_0 files)
        [ -f $T-$q$H.gguf ] || python3 scripts/quant_twin.py $T-F16.gguf $T-$q$H.gguf $q ${TWIN_HEAD:-} > /dev/null
        for tree in ${TREES:-. .ab/old .}; do  # this tree twice: the spread of two runs
            [ -d $tree/gg ] && echo "$tree: $(PYTHONPATH=$tree:$PYTHONPATH python3 scripts/model_steps.py $T-$q$H.gguf \
                $( [ -n "${STEPS:-}" ] || echo --total ) | tail -${STEPS:+30}${STEPS:-1})"
        done
        if [ -n "${TRACE:-}" ]; then  # TRACE=1: per-kernel durations and gaps inside the replay (scripts/trace_steps.py)
            IFS=';' read -ra tflags <<< "${TRACE_FLAGS:-}"
            for flags in "" "${tflags[@]}"; do flags="${TRACE_BASE:-} $flags"
                python3 scripts/model_steps.py $T-$q$H.gguf --total --trace /tmp/tr.json $flags > /tmp/tr.log 2>&1
                N=$(grep -o "[0-9]* steps" /tmp/tr.log | head -1 | cut -d' ' -f1)
                echo "trace [$flags] $q: $(tail -1 /tmp/tr.log)"
                python3 scripts/trace_steps.py /tmp/tr.json ${N:-0} > "$OUT/trace_${q}${flags// /}.txt" 2>&1; tail -1 "$OUT/trace_${q}${flags// /}.txt"
            done
        fi
        IFS=';' read -ra fl <<< "${FLAGS:-}"  # this tree with model_steps.py switches: FLAGS="--no-stream;--no-epilogue",
        for r in $(seq 1 ${ROUNDS:-1}); do    # ROUNDS times, alternating
            for flags in "${fl[@]}"; do echo "[$flags]: $(python3 scripts/model_steps.py $T-$q$H.gguf --total $flags | tail -1)"; done
        done
    done 2>&1 | tee "$OUT/twin.log"
    ;;
prep)  # the twin mode (same TWIN, TREES, FLAGS) in the background, output discarded: twin files made and
    # every tree's kernels compiled into the disk cache while this call runs tests, so a twin call
    # right after measures at once
    OUT=/tmp/prep setsid bash -c "bash '$0' twin; touch /tmp/prep_done" > /tmp/prep.log 2>&1 < /dev/null &
    echo "twin warming up in the background"
    ;;
ncu)  # Nsight Compute sections of each kernel of one decode token of the twin (NCU_K: a kernel-name regex)
    mkdir -p $W
    T=$W/${TWIN_DIMS:=8b}${TWIN_LAYERS:=4}; q=${TWIN:-q4_0}
    [ -f $T-F16.gguf ] || python3 .anchors/gen_gguf.py --dims $TWIN_DIMS --layers $TWIN_LAYERS --out $T-F16.gguf \
        --tok .anchors/smol_tok_meta.json > /dev/null
    [ -f $T-$q.gguf ] || python3 scripts/quant_twin.py $T-F16.gguf $T-$q.gguf $q > /dev/null
    timeout ${NCU_TIMEOUT:-300} ncu --clock-control none --profile-from-start off -k "regex:${NCU_K:-.}" \
        --launch-count ${NCU_COUNT:-60} --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section MemoryWorkloadAnalysis ${NCU_METRICS:+--metrics "$NCU_METRICS"} --csv --page details \
        python3 scripts/ncu_model.py $T-$q.gguf > "$OUT/ncu_${TWIN_DIMS}_$q.csv" 2> "$OUT/ncu_err.log"
    echo "ncu exit $?: $(wc -l < "$OUT/ncu_${TWIN_DIMS}_$q.csv") lines"
    ;;
*) echo "usage: gpu_session.sh lcpp|tests|checks|bench|models|models8b|abbench|twin|prep|ncu"; exit 2 ;;
esac
