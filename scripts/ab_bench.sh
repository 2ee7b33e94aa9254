#!/usr/bin/env bash
# A/B of the benchmarks between another tree (BASE, e.g. an exported older commit) and this one,
# alternating in each of ROUNDS rounds on one machine: bench_ops, then bench_attention decode and
# prefill (MHA, and GQA with 8 K/V heads). Prints gg's rows prefixed by the tree.
#   bash scripts/ab_bench.sh .ab/base        (ROUNDS=2; OUT collects the logs)
set -u
cd "$(dirname "$0")/.."
BASE=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/gg-ab}
mkdir -p "$OUT"
. scripts/gpu_env.sh
here=$(pwd)
for round in $(seq 1 "${ROUNDS:-2}"); do
    for tree in "$BASE" "$here"; do
        name=$([ "$tree" = "$here" ] && echo head || echo base)
        for cmd in "bench/bench_ops.py" "bench/bench_attention.py --only decode,prefill --no-compile" \
                   "bench/bench_attention.py --only decode,prefill --no-compile --n-head-kv 8"; do
            echo "=== $name round $round: $cmd" >> "$OUT/ab_all.log"
            (cd "$tree" && PYTHONPATH="$tree:/tmp/site" python3 $cmd) > "$OUT/last.log" 2>&1
            cat "$OUT/last.log" >> "$OUT/ab_all.log"
            grep -E "^(gg \(|attention |\[)|^[a-z_+0-9]+ .*[0-9]|Error" "$OUT/last.log" | grep -v "^torch" | sed "s/^/$name r$round | /"
        done
    done
done
