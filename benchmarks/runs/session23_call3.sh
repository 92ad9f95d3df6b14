#!/usr/bin/env bash
# Session 23, call 3: NOT RUN (refused: no machine). What is left of call 2 (never run: five refusals spent its device time) that
# fits ~200 s: the MoE kernels' GPU tests (v2 with every wgmma tile waiting, the tall tiles no
# longer xfail; they did not run in session 22 either), then where 64-row tiles start to pay.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s23c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=10 step gpu_tests_moe 170 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py
TAILN=8 step tall_from 45 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64 --warps 8 --tokens 2048 --confirm 4096 --json $R/tall_from.json
