#!/usr/bin/env bash
# Session 23, call 4: NOT RUN (too little device time left to start a machine). The last ~300 s of device time (after eight refusals): as many of the MoE
# kernels' GPU tests as fit 100 s (-vv names each, so a cut run still says which passed).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s23c4; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=40 step gpu_tests_moe 100 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py
