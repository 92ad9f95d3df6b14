#!/usr/bin/env bash
# Session 28, call 2 (~9 min; an H100 or an H200). Call 1's ncu: 48% of the 8-row v2 gate_up's
# shared-load wavefronts are bank conflicts, all from the words' unswizzled tile (rows 64 bytes
# apart: 4-way). GOSSAMER_V2_WORDS_GROUP_MAJOR=1 loads the words group-major (rows 16 bytes apart).
# 1. its GPU tests (v2 at 120b shapes, every tile); 2. one 120b layer at 64 tokens, default and
# group-major in interleaved processes, two rounds; 3. ncu's bank conflicts with it;
# 4. C=64 with it, then without (README's command; --kv-cache-gib 10 on an H100).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s28c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
GM=GOSSAMER_V2_WORDS_GROUP_MAJOR=1
TAILN=4 step gpu_tests 120 env $GM python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "v2"
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3 --ab-rounds 1"
for round in 1 2; do
    TAILN=2 step layer_default_r$round 50 python3 $SW --json $R/layer_default_r$round.json
    TAILN=2 step layer_group_major_r$round 50 env $GM python3 $SW --json $R/layer_group_major_r$round.json
done
SECTIONS="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis_Tables"
METRICS="--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__inst_executed.sum"
TAILN=2 step ncu_group_major 90 env $GM ncu --clock-control none --target-processes all -k regex:_v2_ -c 4 \
    $SECTIONS $METRICS --csv --page raw --log-file $R/ncu_group_major.csv python3 $SW
TAILN=12 step table_group_major 30 python3 benchmarks/ncu_step.py summarize $R/ncu_group_major.csv --stalls 6 \
    --match 'bank_conflicts_pipe_lsu_mem_shared_op_ld.sum$|wavefronts_mem_shared_op_ld.sum$|sass_inst_executed_op_shared_ld.sum$'
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=4 step tp120_c64_group_major 170 env $GM python3 $TP --json $R/tp120_c64_group_major.json
TAILN=4 step tp120_c64_default 170 python3 $TP --json $R/tp120_c64_default.json
