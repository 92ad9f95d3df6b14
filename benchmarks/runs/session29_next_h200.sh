#!/usr/bin/env bash
# For the next H200 (~9.5 min; session29_call1.sh never ran: no H200 came in session 29). README
# still shows session 26's H200 figures; since then sessions 27-29 changed the 8-row MoE tile
# (the 12-instruction unpack, scales without clamps, and now the mma.sync K order by default:
# H100 C=64 +3.1-3.8%). The H200's MoE was issue-bound (session 12's ncu), so fewer instructions
# should pay more there. Most wanted first, so a cut call still brings back the top:
# 1. C=64 and C=256 for 120b with today's default (README's numbers);
# 2. one 120b layer at 64 tokens, v2's order against the mma.sync one, each with and without the
#    scales padded for async copies (V2_PADDED_SCALES, session 30; maxnreg, which this step timed
#    until then, was slower on an H100), in-process, 2 rounds;
# 3. Nsight Compute on the two MoE kernels of the first two layers at batch 64 (issue use, stalls,
#    and whether the words' bank conflicts are gone on the bar's card too).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s29nh; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
TAILN=4 step tp120_c64 150 python3 $TP --concurrency 64 $KV --json $R/tp120_c64.json
grep -q H200 $R/gpu.txt && TAILN=4 step tp120_c256 190 python3 $TP --concurrency 256 --json $R/tp120_c256.json
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-stages 3"
TAILN=9 step layer_orders 110 python3 $SW --ab-orders 0,1 --ab-padded 0,1 --ab-rounds 2 --json $R/layer_orders.json
TAILN=14 step ncu_b64 100 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R/ncu -k regex:_v2_ -c 4
