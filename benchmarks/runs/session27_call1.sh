#!/usr/bin/env bash
# Session 27, call 1 (an H200: C=256 in bf16 needs more than an H100's 78 GiB; ~9 min). The MoE
# kernels build their e8m0 scales without a clamp (one IMAD a bf16 scale pair; v2's 8-row loop
# 483 -> 456 instructions offline); GOSSAMER_CLAMP_SCALES=1 is the previous code.
# 1. the MoE kernels' GPU tests (the scale change touches every MXFP4 kernel);
# 2. one 120b MoE layer at 64 tokens, 8-row tiles: K order (v2 / mma.sync) x stages 3 / 2 x
#    scale groups 8 / 4 a step, two interleaved rounds; then the clamped scales' default tile;
# 3. C=256 and C=64 with the new default (the aim's and the bar's commands).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests_moe 170 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py
TAILN=18 step moe_ab_new 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm "" --ab-orders 0,1 --ab-stages 3,2 --ab-groups 8,4 --json $R/moe_ab_new.json
TAILN=5 GOSSAMER_CLAMP_SCALES=1 step moe_ab_clamp 60 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm "" --ab-orders 0 --ab-stages 3 --ab-groups 8 --ab-rounds 3 --json $R/moe_ab_clamp.json
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024"
grep -q H200 $R/gpu.txt && TAILN=4 step tp120_c256 200 python3 $TP --concurrency 256 --json $R/tp120_c256.json
TAILN=4 step tp120_c64 100 python3 $TP --concurrency 64 $KV --json $R/tp120_c64.json
