#!/usr/bin/env bash
# Session 28, call 5 (~3 min, an H100): the fp16-operand tiles (GOSSAMER_V2_FP16=1) with their
# words loaded as v2's tile (rows 64 bytes apart, read by ldmatrix) instead of [R, 8, 4] (rows
# 128 bytes apart: call 4's ncu found 8-way conflicts). One 120b layer at 64 tokens, default and
# fp16 (scale prefetch on / off), interleaved, two rounds; every row checked against the reference.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s28c5; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3 --ab-rounds 1"
for round in 1 2; do
    TAILN=2 step layer_default_r$round 50 python3 $SW --json $R/layer_default_r$round.json
    TAILN=3 step layer_fp16_r$round 60 env GOSSAMER_V2_FP16=1 python3 $SW --ab-prefetch 1,0 --json $R/layer_fp16_r$round.json
done
