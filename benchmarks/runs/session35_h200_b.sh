#!/usr/bin/env bash
# Session 35, call 2 (~10 min, the machine call 1 left warm; what finishes comes back, most
# wanted first): the split of small experts to the grouped GEMV (V2_GEMV_MAX_COUNT, new): its GPU
# tests, what a busy expert costs v2 and the GEMV at 1-4 tokens and the split at C=64's routings
# (tokens_per_expert_ab.py), then README's C=64 with the split at 1 and the default; the first
# per-kernel profile of a batch-256 step; then, if call 1's layer winner $1 is not the default,
# 20b's batch 1 in it (fusion_ab.py; the rule's 20b >= 700 half) and C=64 in $1 again.
# Its first form ran on an H100 as call 1 (results/session35_call1); since then the split's GEMV
# loops over the small experts (call 4) and tokens_per_expert_ab.py runs at 1 and 3 pairs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BEST=${1:-fp16_lanes}
R=/tmp/s35h200b; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py -k "small_experts or split_schedule" -rfE
TAILN=24 step tokens_per_expert 150 python3 benchmarks/tokens_per_expert_ab.py --per-expert 1,3 --rounds 3 --json $R/tokens_per_expert.json
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
TAILN=3 step tp120_c64_split1 100 env GOSSAMER_V2_GEMV_MAX_COUNT=1 python3 $TP --json $R/tp120_c64_split1.json
TAILN=3 step tp120_c64 100 python3 $TP --json $R/tp120_c64.json
grep -q H200 $R/gpu.txt && TAILN=30 step profile_b256 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 256 --context 1024 --top 24 --json $R/profile_b256.json
[ "$BEST" = fp16_lanes ] && exit 0
TAILN=8 step b1_layouts 110 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,$BEST --rounds 2 --steps 64 --json $R/b1_layouts.json
TAILN=3 step tp120_c64_best 100 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
