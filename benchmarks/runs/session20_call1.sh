#!/usr/bin/env bash
# Session 20, call 1: #8's three batch-1 switches before they become defaults. (1) The whole GPU
# suite (benchmarks/gpu_tests.sh) with GREEDY_IN_GRAPH, ADVANCE_IN_GRAPH and CONTEXT_GRAPHS on, in
# 4 pytest-xdist workers (carried wheels; one file a worker) so Triton's cold compiles use the
# machine's 16 cores: session 19's serial run of a fifth of it hit 150 s. (2) decode_speed.py for
# 20b at batch 1, 1k and 8k, with the same switches (README's numbers once they are defaults).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export GOSSAMER_GREEDY_IN_GRAPH=1 GOSSAMER_ADVANCE_IN_GRAPH=1 GOSSAMER_CONTEXT_GRAPHS=1
R=/tmp/s20c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s20c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cat $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
TAILN=30 step gpu_tests 400 bash benchmarks/gpu_tests.sh -n 4 --dist loadfile --durations=12
TAILN=12 step decode_20b 170 python3 benchmarks/decode_speed.py --models gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_20b.json
