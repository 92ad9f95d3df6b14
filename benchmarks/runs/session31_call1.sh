#!/usr/bin/env bash
# Session 31, call 1 (~9.5 min, either card). An H100 runs session30_call3.sh (the padded scales'
# layer A/B, their GPU tests, C=64 with and without them if the layer wins by 1%). An H200 runs,
# most wanted first: the padded layer A/B (2 rounds); README's C=64 with today's default (sessions
# 27-29's tile changes never ran on an H200); the GPU tests; C=64 padded only if the layer won.
set -u
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    exec bash benchmarks/runs/session30_call3.sh
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s31c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=9 step layer_padded 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-stages 3 --ab-orders 1 --ab-padded 0,1 --ab-rounds 2 --json $R/layer_padded.json
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64"
TAILN=4 step tp120_c64 150 python3 $TP --json $R/tp120_c64.json
TAILN=8 step gpu_tests 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "padded_scales or 120b_grouped_v2_sync or test_gpu_120b_grouped_v2" -rA
python3 benchmarks/runs/padded_wins.py $R/layer_padded.json || exit 0
TAILN=4 step tp120_c64_padded 150 env GOSSAMER_V2_PADDED_SCALES=1 python3 $TP --json $R/tp120_c64_padded.json
