#!/usr/bin/env bash
# Prepared in session 17 for after session19_call1.sh (then named session18_call2.sh; session 18
# was lent no machine and added the context graphs). #8, ~9 min. The whole GPU suite with the
# greedy pick and the context graphs on (both =1 below; set either to 0 first if call 1 measured
# it slower). The suite last ran whole in session 16 (209 passed); sessions 17 and 18 changed
# gemv, routing, MoE and runner code, and session 18 added tests/runner/test_context_graphs_gpu.py
# and the v2 sync order's and gate_up SCALES_T's GPU tests. Then decode_speed.py at batch 1, 1k
# and 8k context, for the record (BENCHMARKS.md, README's numbers).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD GOSSAMER_GREEDY_IN_GRAPH=${GOSSAMER_GREEDY_IN_GRAPH:-1} \
    GOSSAMER_CONTEXT_GRAPHS=${GOSSAMER_CONTEXT_GRAPHS:-1}
R=/tmp/s19c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step gpu_suite 420 bash benchmarks/gpu_tests.sh --durations=10
TAILN=12 step decode_b1 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
