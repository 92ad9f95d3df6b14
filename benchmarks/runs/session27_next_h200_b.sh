#!/usr/bin/env bash
# For the next H200, after session27_next_h200_a.sh on the same warm machine (~7 min; on an H100
# it runs too, with --kv-cache-gib 10). V2_ACT_SWAP (written at the end of session 27, off, never
# run on a GPU): 8-row tiles read activations stored with position bits 1 and 4 swapped, so each
# mma.sync's B registers are one 8-byte load; offline v2's 8-row loop 447 -> 411 instructions
# (gate_up), 454 -> 429 (down). Then the batch-64 step profile and graph timeline on the bar's
# card (never run on an H200).
# 1. the new GPU tests of the swap (and the MoE file's others: graphs, repacked words);
# 2. one 120b layer at 64 tokens, swap off / on in interleaved processes;
# 3. the C=64 bar's command with the swap (a's run is the one without);
# 4. step_profile and graph_timeline at batch 64 (default code).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27nb; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests_moe 120 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py -k "act_swap or sync_order or repacked or graph"
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3"
for round in 1 2; do
  TAILN=3 step moe_noswap_r$round 50 python3 $SW --json $R/moe_noswap_r$round.json
  TAILN=3 GOSSAMER_V2_ACT_SWAP=1 step moe_swap_r$round 50 python3 $SW --json $R/moe_swap_r$round.json
done
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=3 GOSSAMER_V2_ACT_SWAP=1 step tp120_c64_swap 150 python3 $TP --json $R/tp120_c64_swap.json
TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
