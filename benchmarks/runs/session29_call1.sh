#!/usr/bin/env bash
# Session 29, call 1 (meant for an H200, ~9.5 min): README's numbers first, then what sessions 27
# and 28 left unmeasured on the bar's card, most wanted first, so a cut call still brings back the top:
# 1. C=64 and C=256 for 120b with today's default (README still shows session 26's H200 figures;
#    session 27's 12-instruction unpack gave +2.1% at C=64 on an H100, which is not issue-bound);
# 2. one 120b layer at 64 tokens: default against the fp16-operand tiles (GOSSAMER_V2_FP16=1,
#    words as v2's tile: session28_call5.sh, never run), one round, every row checked;
# 3. Nsight Compute on the two MoE kernels of the first two layers at batch 64.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s29c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
TAILN=4 step tp120_c64 150 python3 $TP --concurrency 64 $KV --json $R/tp120_c64.json
grep -q H200 $R/gpu.txt && TAILN=4 step tp120_c256 190 python3 $TP --concurrency 256 --json $R/tp120_c256.json
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3 --ab-rounds 1"
TAILN=2 step layer_default 50 python3 $SW --json $R/layer_default.json
TAILN=3 step layer_fp16 60 env GOSSAMER_V2_FP16=1 python3 $SW --ab-prefetch 1,0 --json $R/layer_fp16.json
TAILN=14 step ncu_b64 110 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R/ncu -k regex:_v2_ -c 4
