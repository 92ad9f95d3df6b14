#!/usr/bin/env bash
# Session 23, call 4: NOT RUN (too little device time left to start a machine). The last ~300 s of device time (after eight refusals): as many of the MoE
# kernels' GPU tests as fit 100 s (-vv names each, so a cut run still says which passed).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=40 step gpu_tests_moe 100 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py
