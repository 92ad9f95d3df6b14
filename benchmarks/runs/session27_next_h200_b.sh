#!/usr/bin/env bash
# For the next H200, after session27_next_h200_a.sh on the same warm machine (~5 min; on an H100
# it runs too, with --kv-cache-gib 10): the batch-64 step profile and graph timeline on the bar's
# card (never run on an H200), then one round of the layer A/B of V2_ACT_SWAP (21% slower on an
# H100 with 8% fewer instructions; does the H200 agree?).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27nb; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3"
TAILN=3 step moe_noswap 50 python3 $SW --json $R/moe_noswap.json
TAILN=3 GOSSAMER_V2_ACT_SWAP=1 step moe_swap 50 python3 $SW --json $R/moe_swap.json
