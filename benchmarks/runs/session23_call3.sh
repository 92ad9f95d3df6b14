#!/usr/bin/env bash
# Session 23, call 3: NOT RUN (refused: no machine). What is left of call 2 (never run: five refusals spent its device time) that
# fits ~200 s: the MoE kernels' GPU tests (v2 with every wgmma tile waiting, the tall tiles no
# longer xfail; they did not run in session 22 either), then where 64-row tiles start to pay.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=10 step gpu_tests_moe 170 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py
TAILN=8 step tall_from 45 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64 --warps 8 --tokens 2048 --confirm 4096 --json $R/tall_from.json
