#!/usr/bin/env bash
# Session 26, call 4: the router (to 64 rows) and O (to 32) on the Triton GEMV's wide tiles by
# default now (gemv.CLASS_MAX_M; call 3's sweep), QKV on cuBLAS. In order of need:
# 1. GPU tests: the projections at 1..64 rows, the whole model on the Triton ops (prompt chunks
#    of 17..64 tokens take the wide tiles);
# 2. the C=64 bar's command with the wide tiles and without (GOSSAMER_GEMV_WIDE=0: cuBLAS past 8
#    rows, as before), then C=32 both ways (O's 17..32-row tile);
# 3. H200 only: the batch-64 step profile and its graph timeline (the C=64 bar's per-kernel times).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s26c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"  # the H100's default budget preempts at C=64
grep -q H200 $R/gpu.txt && KV=""
TAILN=6 step gpu_tests 150 bash benchmarks/gpu_tests.sh tests/kernels/test_gemv.py tests/kernels/test_triton_model.py
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 $KV"
TAILN=3 step tp120_c64 150 python3 $TP --concurrency 64 --json $R/tp120_c64.json
TAILN=3 GOSSAMER_GEMV_WIDE=0 step tp120_c64_cublas 100 python3 $TP --concurrency 64 --json $R/tp120_c64_cublas.json
if grep -q H200 $R/gpu.txt; then
  TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
  TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
fi
TAILN=3 step tp120_c32 80 python3 $TP --concurrency 32 --json $R/tp120_c32.json
TAILN=3 GOSSAMER_GEMV_WIDE=0 step tp120_c32_cublas 80 python3 $TP --concurrency 32 --json $R/tp120_c32_cublas.json
