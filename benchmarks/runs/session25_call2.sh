#!/usr/bin/env bash
# Session 25, call 2 (after call 1): the fp8 cache's accuracy on the GPU (the trained built-in
# model in bf16 through the Triton kernels, benchmarks/kv_cache_accuracy.py), concurrency 256
# (the aim: 10,000 output tok/s for 120b) over bf16 and fp8 KV, then C=64 as a closed
# loop of 64 users with 2 requests each.
# On an H100 C=256 does not fit the bf16 cache (~38.6 GB of KV beside 61 GB of weights): fp8 only.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s25c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=5 step kv_accuracy 90 python3 benchmarks/kv_cache_accuracy.py --device cuda --json $R/kv_accuracy.json
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
if grep -q H200 $R/gpu.txt; then
  TAILN=6 step tp120_c256_fp8 180 python3 $TP --concurrency 256 --kv-cache-dtype fp8 --json $R/tp120_c256_fp8.json
  TAILN=6 step tp120_c256 180 python3 $TP --concurrency 256 --json $R/tp120_c256.json
  TAILN=6 step tp120_c64_loop2 150 python3 $TP --concurrency 64 --requests-per-user 2 --json $R/tp120_c64_loop2.json
else
  TAILN=6 step tp120_c256_fp8 200 python3 $TP --concurrency 256 --kv-cache-dtype fp8 --json $R/tp120_c256_fp8.json
  TAILN=6 step tp120_c64_kv10_loop2 150 python3 $TP --concurrency 64 --kv-cache-gib 10 --requests-per-user 2 --json $R/tp120_c64_kv10_loop2.json
fi
