#!/usr/bin/env bash
# Session 30, call 3 (~9 min, either card): the scales padded for async copies
# (GOSSAMER_V2_PADDED_SCALES). Call 2's warp sampling (H100): 13.5% of the 8-row gate_up's
# samples wait at one register move whose scoreboard the scale LDG.U8s share (SASS control bits),
# i.e. on global latency. Padded, the loop has no global loads left (offline).
# 1. one 120b layer at 64 tokens, padded off/on, 3 interleaved rounds, confirmed at 128;
# 2. the GPU tests of v2 (padded scales, the default tiles);
# 3. only if the padded layer is faster by 1% or more: C=64 with the padded scales, then without
#    (same KV budget; +3.8 GB of padded scales).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s30c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=14 step layer_padded 120 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm 128 --ab-groups 8 --ab-stages 3 --ab-orders 1 --ab-padded 0,1 --ab-rounds 3 --json $R/layer_padded.json
TAILN=8 step gpu_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "padded_scales or 120b_grouped_v2_sync or test_gpu_120b_grouped_v2" -rA
python3 benchmarks/runs/padded_wins.py $R/layer_padded.json || exit 0
KV="--kv-cache-gib 9.5"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=4 step tp120_c64_padded 150 env GOSSAMER_V2_PADDED_SCALES=1 python3 $TP --json $R/tp120_c64_padded.json
TAILN=4 step tp120_c64 150 python3 $TP --json $R/tp120_c64.json
