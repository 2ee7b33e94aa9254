#!/usr/bin/env bash
# Like ab_decode.sh for several variants: each argument is a Python snippet applied before the
# decode benchmark ("pass" = the plain code); two rounds, variants alternating in each.
#   bash scripts/ab_multi.sh pass "import gg.backends.cuda.families.matmul as M; M.MMV_BLOCK = 256" ...
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
for round in 1 2; do
    i=0
    for p in "$@"; do
        i=$((i + 1))
        python3 -c "import sys, runpy; sys.path.insert(0, 'bench'); $p
sys.argv = ['bench_attention.py', '--only', 'decode', '--no-compile']; runpy.run_path('bench/bench_attention.py', run_name='__main__')" \
            2>&1 | grep -E "^gg \(cuda\)|Error|error|^bench_attention" | sed "s/^/v$i /"
    done
done
