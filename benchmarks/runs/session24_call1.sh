#!/usr/bin/env bash
# Session 24, call 1, in order of need (each step packs its log; the call's limit cuts the tail):
# 1. the MoE kernels' GPU tests, not run since session 21 (since then: v2's sorted schedule and
#    slot_sum, the per-step wgmma wait on every tile, 64-row prefill tiles);
# 2. on an H200: the C=64 bar's command (never run there since session 13), the batch-64 step
#    profile (never run on an H200), batch 1 for the README;
#    on an H100: where 64-row tiles start to pay (2048 / 4096 tokens), the 8k-prompt TTFT with and
#    without them, then the kernel test files
#    that session 23's call 1 did not run.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s24c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
K=tests/kernels
TAILN=12 step gpu_tests_moe 170 bash benchmarks/gpu_tests.sh $K/test_moe_mxfp4.py $K/test_moe_grouped_gemv.py
if grep -q H200 $R/gpu.txt; then
  TAILN=6 step tp120_c64 170 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
  TAILN=45 step profile120_b64 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 24 --json $R/profile120_b64.json
  TAILN=14 step decode_b1 120 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
else
  TAILN=8 step tall_from 50 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64 --warps 8 --tokens 2048 --confirm 4096 --json $R/tall_from.json
  T8="benchmarks/decode_speed.py --models gpt-oss-120b --contexts 8192 --batch-sizes 1 --steps 8 --prompt-len 8192 --no-warmup"
  TAILN=3 step ttft8k_tall 80 python3 $T8 --json $R/ttft8k_tall.json
  TAILN=3 step ttft8k_32 80 env GOSSAMER_V2_TALL_MIN_PAIRS=1000000 python3 $T8 --json $R/ttft8k_32.json
  TAILN=10 step gpu_tests_kernels 200 bash benchmarks/gpu_tests.sh $K/test_attention.py $K/test_attention_rope_fused.py $K/test_norm.py $K/test_packed_gate_up.py $K/test_route_in_experts.py $K/test_sampling.py
fi
