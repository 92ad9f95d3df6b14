#!/usr/bin/env bash
# Session 23, call 1: session 22's call 5 (never run: v2's tall tiles with the per-step wgmma wait;
# the 32- and 16-row tiles with and without it), then the first third of the GPU suite.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s23c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step tall_wait 80 python3 benchmarks/moe_grouped_sweep.py --block-ms 64,128,32 --warps 8 --tokens 1024 --confirm 8192 --json $R/tall_wait.json
TAILN=4 step m32_wait 50 env GOSSAMER_V2_ASYNC_MMA_MAX_M=16 python3 benchmarks/moe_grouped_sweep.py --block-ms 32 --warps 8 --tokens 1024 --confirm 8192 --json $R/m32_wait.json
TAILN=4 step m16 50 python3 benchmarks/moe_grouped_sweep.py --block-ms 16 --warps 4 --tokens 256 --confirm "" --json $R/m16.json
TAILN=4 step m16_wait 50 env GOSSAMER_V2_ASYNC_MMA_MAX_M=8 python3 benchmarks/moe_grouped_sweep.py --block-ms 16 --warps 4 --tokens 256 --confirm "" --json $R/m16_wait.json
TAILN=12 step gpu_tests_1of3 300 env GPU_TESTS_SHARD=1/3 bash benchmarks/gpu_tests.sh
