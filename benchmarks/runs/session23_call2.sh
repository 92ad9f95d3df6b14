#!/usr/bin/env bash
# Session 23, call 2: NOT RUN (five tries refused, no machine; their cost left too little device time). Was:
# 1. where 64-row v2 tiles start to pay (32 against 64 rows, both waiting for their MMAs each
#    step, now the default) at 2048 / 4096 / 8192 tokens of one 120b layer;
# 2. the time to first token of an 8k prompt (one 8192-token prefill chunk: 256 pairs an expert,
#    64-row tiles) against the same with the tall tiles off (GOSSAMER_V2_TALL_MIN_PAIRS huge);
# 3. the kernel files of the GPU suite that call 1's shard did not run (the tall-tile GPU test is
#    no longer xfail), the MoE's first. In order of need: the call's time limit cuts the tail.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s23c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step tall_from 50 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64 --warps 8 --tokens 2048 --confirm 4096,8192 --json $R/tall_from.json
# the GPU tests of the changed kernel first (call 1's shard 1/3 ran other files)
K=tests/kernels
TAILN=10 step gpu_tests_moe 160 bash benchmarks/gpu_tests.sh $K/test_moe_mxfp4.py $K/test_moe_grouped_gemv.py
T8="benchmarks/decode_speed.py --models gpt-oss-120b --contexts 8192 --batch-sizes 1 --steps 8 --prompt-len 8192 --no-warmup"
TAILN=3 step ttft8k_tall 90 python3 $T8 --json $R/ttft8k_tall.json
TAILN=3 step ttft8k_32 90 env GOSSAMER_V2_TALL_MIN_PAIRS=1000000 python3 $T8 --json $R/ttft8k_32.json
TAILN=10 step gpu_tests_kernels 200 bash benchmarks/gpu_tests.sh $K/test_attention.py $K/test_attention_rope_fused.py $K/test_norm.py $K/test_packed_gate_up.py $K/test_route_in_experts.py $K/test_sampling.py
