#!/usr/bin/env bash
# Session 25, call 5 (needs an H200: 120b's bf16 KV for C=256 x 2k tokens, ~38.6 GB beside 61 GB
# of weights, does not fit an H100): the aim's command, concurrency 256 (10,000 output tok/s), then
# the C=64 bar's command on the same card (last measured on an H200 in session 13).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s25c5; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
TAILN=6 step tp120_c256 200 python3 $TP --concurrency 256 --json $R/tp120_c256.json
TAILN=6 step tp120_c64 120 python3 $TP --concurrency 64 --json $R/tp120_c64.json
