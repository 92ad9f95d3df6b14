#!/usr/bin/env bash
# Session 24, call 4: NOT RUN (too little device time left to start a machine). What fits the last ~230 s of device time after refusals: the C=64 bar's
# command alone (H200: default KV budget; H100: --kv-cache-gib 10, its default preempts).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s24c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV=""; grep -q H200 $R/gpu.txt || KV="--kv-cache-gib 10"
TAILN=6 step tp120_c64 200 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 $KV --json $R/tp120_c64.json
