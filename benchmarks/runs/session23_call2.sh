#!/usr/bin/env bash
# Session 23, call 2: where 64-row v2 tiles start to pay (32 against 64 rows, both waiting for
# their MMAs each step, now the default) at 2048 / 4096 / 8192 tokens of one 120b layer, then the
# other two thirds of the GPU suite (the tall-tile GPU test is no longer xfail).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s23c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step tall_from 60 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64 --warps 8 --tokens 2048 --confirm 4096,8192 --json $R/tall_from.json
TAILN=12 step gpu_tests_2of3 250 env GPU_TESTS_SHARD=2/3 bash benchmarks/gpu_tests.sh
TAILN=12 step gpu_tests_3of3 250 env GPU_TESTS_SHARD=3/3 bash benchmarks/gpu_tests.sh
