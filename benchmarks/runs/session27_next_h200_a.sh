#!/usr/bin/env bash
# For the next H200 (not run in session 27: five tries got no H200; C=256 in bf16 needs more than
# an H100's 78 GiB; ~9 min). Session 27's MoE changes (scales without clamps, the 12-instruction
# unpack of the repacked words; v2's 8-row loop 491 -> 447 instructions offline) gave one 120b
# layer at 64 tokens -1.5% and C=64 +2.1% on an H100, which is not issue-bound; session 12's ncu
# found the H200's grouped MoE issue-bound (71% issue use, `not_selected` on top), so the gain
# should be larger there. GOSSAMER_MOE_OLD_UNPACK=1 is session 26's code.
# 1. one 120b layer at 64 tokens, 8-row tiles, new / old in interleaved processes; the mma.sync
#    K order (V2_SYNC_ORDER, 11% fewer instructions, slower on the H100) and 4 stages beside the
#    default in the first; 16-row tiles at 256 tokens (every row is checked against the reference);
# 2. C=256 and C=64 with the new default, then C=64 with the old code (the bar's and the aim's
#    commands; README's numbers);
# 3. Nsight Compute on the two MoE kernels of the first two layers at batch 64 (issue use, stalls).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27na; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8"
TAILN=6 step moe_new_r1 90 python3 $SW --ab-orders 0,1 --ab-stages 3,4 --json $R/moe_new_r1.json
TAILN=3 step moe_new_m16 40 python3 benchmarks/moe_grouped_sweep.py --block-ms 16 --warps 4 --tokens 256 --confirm= --json $R/moe_new_m16.json
TAILN=3 GOSSAMER_MOE_OLD_UNPACK=1 step moe_old_r1 50 python3 $SW --ab-orders 0 --ab-stages 3 --json $R/moe_old_r1.json
TAILN=3 step moe_new_r2 50 python3 $SW --ab-orders 0 --ab-stages 3 --json $R/moe_new_r2.json
TAILN=3 GOSSAMER_MOE_OLD_UNPACK=1 step moe_old_r2 50 python3 $SW --ab-orders 0 --ab-stages 3 --json $R/moe_old_r2.json
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
grep -q H200 $R/gpu.txt && TAILN=4 step tp120_c256 200 python3 $TP --concurrency 256 --json $R/tp120_c256.json
TAILN=4 step tp120_c64 150 python3 $TP --concurrency 64 $KV --json $R/tp120_c64.json
TAILN=4 GOSSAMER_MOE_OLD_UNPACK=1 step tp120_c64_old 130 python3 $TP --concurrency 64 $KV --json $R/tp120_c64_old.json
grep -q H200 $R/gpu.txt && TAILN=14 step ncu_b64 120 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R/ncu -k regex:_v2_ -c 4
