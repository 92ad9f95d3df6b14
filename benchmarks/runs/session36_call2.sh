#!/usr/bin/env bash
# Session 36, call 2 (~2 min, the H100 call 1 left warm): README's C=64 after the pruning, against
# session 35's H100 runs of the same command (2,096.1 and 2,096.7 tok/s, results/session35_call1-2).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s36c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=3 step tp120_c64 150 python3 benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64.json
