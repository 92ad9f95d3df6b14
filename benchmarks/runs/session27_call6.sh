#!/usr/bin/env bash
# Session 27, call 6 (a fresh H100, 252 s of device time left; written here from the command as
# run): V2_ACT_SWAP, written after call 5, against the default in interleaved processes (one 120b
# MoE layer at 64 tokens, 8-row tiles, every row checked against the reference), then its GPU
# tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27c6; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3"
TAILN=3 GOSSAMER_V2_ACT_SWAP=1 step moe_swap_r1 40 python3 $SW --json $R/moe_swap_r1.json
TAILN=3 step moe_noswap_r1 30 python3 $SW --json $R/moe_noswap_r1.json
TAILN=3 GOSSAMER_V2_ACT_SWAP=1 step moe_swap_r2 30 python3 $SW --json $R/moe_swap_r2.json
TAILN=4 step gpu_tests_swap 60 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py -k act_swap
