#!/usr/bin/env bash
# Session 29, call 4 (~4 min, an H100 or an H200): the mma.sync order is now the default at 8 rows
# (call 3, H100: one 120b layer at 64 tokens -2.7%, C=64 2,356.8 against 2,271.0 with the sync
# run first). The C=64 pair again in the other order (the new default first, then v2's order
# through GOSSAMER_V2_SYNC_ORDER=0), then v2's GPU tests with the new default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s29c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=4 step tp120_c64 150 python3 $TP --json $R/tp120_c64.json
TAILN=4 step tp120_c64_v2order 90 env GOSSAMER_V2_SYNC_ORDER=0 python3 $TP --json $R/tp120_c64_v2order.json
TAILN=6 step gpu_tests 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "120b_grouped_v2" -rA
