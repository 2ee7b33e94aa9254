#!/usr/bin/env bash
# Run the benchmarks on a GPU machine: bench_ops.py, then bench_attention.py (MHA, then GQA with
# 8 K/V heads). JSON results and logs go to ${OUT:-/tmp/gg-bench}. Extra arguments are passed to
# every bench_attention.py run (e.g. --profile, --steps 100, --no-compile).
#   ONLY="ops attention attention_gqa"  picks the runs;  SMALL=1  passes --small to all of them.
# Exit status: non-zero if any run failed (a failed correctness guard in bench_attention exits 3).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gg-bench}
mkdir -p "$OUT"
. scripts/gpu_env.sh
ONLY=${ONLY:-ops attention attention_gqa}
small=()
[ -n "${SMALL:-}" ] && small=(--small)
status=0
summary=()

run() {  # run NAME CMD...: log to $OUT/NAME.log, record the exit status
    local name=$1; shift
    case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
    echo "=== $name: $*" | tee "$OUT/$name.log"
    "$@" 2>&1 | tee -a "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    summary+=("$name: exit $rc")
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
run ops           python3 bench/bench_ops.py ${small[@]+"${small[@]}"} --json "$OUT/ops.json"
run attention     python3 bench/bench_attention.py ${small[@]+"${small[@]}"} --json "$OUT/attention.json" "$@"
run attention_gqa python3 bench/bench_attention.py ${small[@]+"${small[@]}"} --n-head-kv 8 \
                  --json "$OUT/attention_gqa8.json" "$@"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
exit $status
