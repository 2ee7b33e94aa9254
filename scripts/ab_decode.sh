#!/usr/bin/env bash
# A/B of a lowering switch on the decode benchmark, same process family, alternating runs:
#   bash scripts/ab_decode.sh "import gg.backends.cuda.launch as L; L.L2_PREFETCH = False" [bench args]
# prints gg's decode figure for the plain code (A) and with the Python snippet applied (B).
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
patch=$1; shift
args=${*:---only decode --no-compile}
for i in 1 2 3; do
    for v in A B; do
        p=$([ $v = B ] && echo "$patch" || echo "pass")
        python3 -c "import sys, runpy; sys.path.insert(0, 'bench'); $p
sys.argv = ['bench_attention.py'] + sys.argv[1:]; runpy.run_path('bench/bench_attention.py', run_name='__main__')" $args \
            2>&1 | grep -E "^gg \(cuda\)|^\[" | sed "s/^/$v /"
    done
done
