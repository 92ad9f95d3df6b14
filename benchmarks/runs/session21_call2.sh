#!/usr/bin/env bash
# Session 21, call 2: v2's tile configs at BLOCK_M 8 (the C=64 decode steps' tile), never swept
# at that height: (REP, GROUPS_PER_STEP) 1x4, 1x8, 2x4 at 3, 4 and 5 stages on 4 warps, gate_up
# then down, one 120b MoE layer at 64 tokens; then the best pair against the defaults at 64 and
# 128 tokens. Call 1's A/B found fewer stages slower (2 against 3): more bytes in flight may win.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s21c2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 540 python3 benchmarks/moe_grouped_sweep.py --tokens 64 --block-m 8 --tiles 1x4,1x8,2x4 \
  --stages 3,4,5 --sweep-warps 4 --confirm 128 --json $R/sweep_m8.json 2>&1 | tee $R/sweep_m8.log
tar czf "$OUT/results.tgz" -C /tmp s21c2
# Run as two later calls on the same warm machine (their logs sit beside this one's):
# python3 benchmarks/moe_grouped_sweep.py --tokens 64 --block-m 8 --tiles 1x8,1x16 --stages 2,3 \
#   --sweep-warps 4,8 --confirm 32 --json sweep_m8_g16.json
# python3 benchmarks/moe_grouped_sweep.py --tokens 256 --tiles 1x4,1x8,1x16 --stages 3 \
#   --sweep-warps 4,8 --confirm 512,1024 --json sweep_256.json
# python3 benchmarks/moe_grouped_sweep.py --tokens 64 --block-m 8 --tiles 1x8,2x8 --stages 3 \
#   --sweep-warps 2,4 --confirm "" --json sweep_m8_w2.json   (after GROUPS_PER_STEP 8 landed)
