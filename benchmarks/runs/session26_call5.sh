#!/usr/bin/env bash
# Session 26, call 5 (what ~4 minutes hold): the batch-64 graph timeline with the router on the
# wide Triton tile; the batch-64 step profile over an fp8 KV cache (attention us a layer with fp8
# tiles); C=16 with the wide tiles (router and O at 16 rows) and without.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s26c5; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=20 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 16 --json $R/timeline_b64.json
TAILN=14 step profile120_b64_fp8 70 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 8 --kv-cache-dtype fp8 --json $R/profile120_b64_fp8.json
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 16"
TAILN=3 step tp120_c16 60 python3 $TP --json $R/tp120_c16.json
TAILN=3 GOSSAMER_GEMV_WIDE=0 step tp120_c16_cublas 60 python3 $TP --json $R/tp120_c16_cublas.json
