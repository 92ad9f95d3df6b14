#!/usr/bin/env bash
# Session 25, call 1, in order of need (each step packs its log; the call's limit cuts the tail):
# 1. the new fp8 KV cache's GPU tests (attention, the fused RoPE + KV write, the engine);
# 2. H200: the C=64 bar's command (default KV budget; last measured on an H200 in session 13),
#    the same with --kv-cache-dtype fp8, the batch-64 step profile (never run on an H200), batch 1
#    for the README and 120b batch 1 at 8k over an fp8 cache;
#    H100 (--kv-cache-gib 10, its default budget preempts): C=64 bf16 and fp8 KV, the batch-64
#    profile, C=64 as a closed loop of 64 users with 2 requests each.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s25c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step gpu_tests_fp8 150 bash benchmarks/gpu_tests.sh tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py tests/engine/test_async_scheduling_gpu.py -k fp8
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024"
PROFILE="benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 24"
if grep -q H200 $R/gpu.txt; then
  TAILN=6 step tp120_c64 150 python3 $TP --json $R/tp120_c64.json
  TAILN=6 step tp120_c64_fp8 150 python3 $TP --kv-cache-dtype fp8 --json $R/tp120_c64_fp8.json
  TAILN=45 step profile120_b64 110 python3 $PROFILE --json $R/profile120_b64.json
  TAILN=14 step decode_b1 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
  TAILN=8 step decode_b1_fp8 100 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 8192 --batch-sizes 1 --steps 64 --kv-cache-dtype fp8 --json $R/decode_b1_fp8.json
else
  TAILN=6 step tp120_c64_kv10 150 python3 $TP --kv-cache-gib 10 --json $R/tp120_c64_kv10.json
  TAILN=6 step tp120_c64_kv10_fp8 150 python3 $TP --kv-cache-gib 10 --kv-cache-dtype fp8 --json $R/tp120_c64_kv10_fp8.json
  TAILN=45 step profile120_b64 110 python3 $PROFILE --json $R/profile120_b64.json
  TAILN=6 step tp120_c64_kv10_loop2 150 python3 $TP --kv-cache-gib 10 --requests-per-user 2 --json $R/tp120_c64_kv10_loop2.json
fi
