#!/usr/bin/env bash
# Session 24, call 2 (the warm H100 after call 1): the GPU test files not run since session 22
# (the runner's, the mini model's, speculation's), then 20b's 1k-prompt TTFT with the 64-row tiles
# (its 1k prompt has 128 pairs an expert) against 32 rows.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s24c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
T1="benchmarks/decode_speed.py --models gpt-oss-20b --contexts 1024 --batch-sizes 1 --steps 8 --prompt-len 1024"
TAILN=4 step ttft1k_20b_tall 70 python3 $T1 --json $R/ttft1k_20b_tall.json
TAILN=4 step ttft1k_20b_32 70 env GOSSAMER_V2_TALL_MIN_PAIRS=1000000 python3 $T1 --json $R/ttft1k_20b_32.json
TAILN=12 step gpu_tests_rest 400 bash benchmarks/gpu_tests.sh tests/spec/test_spec_gpu.py tests/mini/test_mini_gpu.py tests/runner/test_advance_in_graph_gpu.py tests/runner/test_pinned_uploads_gpu.py tests/spec/test_calibrate.py tests/spec/test_idle_overlap.py
