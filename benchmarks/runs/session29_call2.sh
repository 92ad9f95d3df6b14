#!/usr/bin/env bash
# Session 29, call 2 (~9 min, an H100 or an H200): the mma.sync K order without the activation
# swap (GOSSAMER_V2_SYNC_ORDER=1 now leaves the activations in that order as stored, so their
# tile keeps its swizzle; the swap is GOSSAMER_V2_ACT_SWAP=1 on top). Offline: the words as 4
# LDS.128 a loop instead of 16 four-byte loads (no bank conflicts: a quarter warp reads 2 rows'
# 64 bytes), no scale shuffles, 447 -> 409 instructions a loop (gate_up), 454 -> 421 (down).
# 1. its GPU test (2 and 3 stages, with and without the swap, both word layouts) and the fp16
#    tiles' (their word load changed after their last GPU run);
# 2. one 120b layer at 64 tokens, v2's order against the mma.sync one, in-process, 2 rounds
#    (every row checked against the reference);
# 3. the fp16-operand tiles (session28_call5.sh's layer A/B, one round; never run);
# 4. C=64 with the mma.sync order, then the default (same machine).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s29c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step gpu_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "v2_sync_order or v2_fp16_operands" -rA
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-stages 3"
TAILN=5 step layer_orders 90 python3 $SW --ab-orders 0,1 --ab-rounds 2 --json $R/layer_orders.json
TAILN=3 step layer_fp16 60 env GOSSAMER_V2_FP16=1 python3 $SW --ab-orders 0 --ab-rounds 1 --ab-prefetch 1,0 --json $R/layer_fp16.json
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=4 step tp120_c64_sync 150 env GOSSAMER_V2_SYNC_ORDER=1 python3 $TP --json $R/tp120_c64_sync.json
TAILN=4 step tp120_c64 140 python3 $TP --json $R/tp120_c64.json
