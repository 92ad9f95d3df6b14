#!/usr/bin/env bash
# Session 30, call 3b (~4 min, either card): what fits the device time left after refusals, from
# session30_call3.sh: the padded scales' layer A/B (2 rounds) and their GPU tests; no C=64.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s30c3b; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step layer_padded 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-stages 3 --ab-orders 1 --ab-padded 0,1 --ab-rounds 2 --json $R/layer_padded.json
TAILN=6 step gpu_tests 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "padded_scales" -rA
