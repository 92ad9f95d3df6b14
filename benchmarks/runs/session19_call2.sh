#!/usr/bin/env bash
# Prepared in session 17 for after session19_call1.sh (then named session18_call2.sh; session 18
# was lent no machine and added the context graphs). #8, ~9 min. If call 1 turned GREEDY_IN_GRAPH
# and CONTEXT_GRAPHS on (or to check them before doing so: both =1 below, set either to 0 if it
# lost), the whole GPU suite with them on (it holds session 18's tests/runner/
# test_context_graphs_gpu.py) (session 16's 209 passed with it absent; session 17 changed gemv,
# routing and runner code and ran only test_gemv.py and test_route_in_experts.py on the GPU), then
# decode_speed.py at batch 1 for the record (BENCHMARKS.md, README's numbers), 1k and 8k context.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD GOSSAMER_GREEDY_IN_GRAPH=${GOSSAMER_GREEDY_IN_GRAPH:-1} \
    GOSSAMER_CONTEXT_GRAPHS=${GOSSAMER_CONTEXT_GRAPHS:-1}
R=/tmp/s19c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step gpu_suite 420 bash benchmarks/gpu_tests.sh --durations=10
TAILN=12 step decode_b1 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
