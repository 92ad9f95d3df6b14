#!/usr/bin/env bash
# Session 28, call 3 (~8 min; an H100 or an H200). GOSSAMER_V2_FP16=1: 8-row v2 tiles with fp16
# operands, one mma.sync dot per scale group and the scale on its partial sums (offline, sm_90,
# triton 3.6: 447 -> 381 instructions a loop in gate_up, 454 -> 364 in down; 356 / 353 without
# the scale prefetch). 1. the MoE's v2 GPU tests, the new one included; 2. one 120b layer at 64
# tokens: default, fp16 with and without the scale prefetch, interleaved, two rounds;
# 3. C=64 with fp16, then the default (README's command; --kv-cache-gib 10 on an H100);
# 4. ncu on the fp16 kernels (stalls, issue use).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s28c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
FP16=GOSSAMER_V2_FP16=1
TAILN=4 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "v2" -rf
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3 --ab-rounds 1"
for round in 1 2; do
    TAILN=2 step layer_default_r$round 50 python3 $SW --json $R/layer_default_r$round.json
    TAILN=3 step layer_fp16_r$round 60 env $FP16 python3 $SW --ab-prefetch 1,0 --json $R/layer_fp16_r$round.json
done
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=4 step tp120_c64_fp16 170 env $FP16 python3 $TP --json $R/tp120_c64_fp16.json
TAILN=4 step tp120_c64_default 170 python3 $TP --json $R/tp120_c64_default.json
TAILN=2 step ncu_fp16 60 env $FP16 ncu --clock-control none --target-processes all -k regex:_v2_ -c 4 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --csv --page raw \
    --log-file $R/ncu_fp16.csv python3 $SW
TAILN=6 step table_fp16 30 python3 benchmarks/ncu_step.py summarize $R/ncu_fp16.csv --stalls 6
