#!/usr/bin/env bash
# Session 36, for an H200 with ~10 device minutes left (session35_h200.sh without its C=256 runs,
# ~5 min): the word layouts' layer A/B at 1, 64 and 256 tokens where the MoE is issue-bound (never
# run on an H200), then README's C=64 in the layer's winner at 64 tokens and in the default.
# Rule (NOTES, thirty-third session): >= 3% off the C=64 step with 20b's batch 1 >= 700 makes a
# layout the default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s36h200; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=14 step layer_layouts 110 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256 --rounds 3 --json $R/layer_layouts.json
BEST=$(python3 benchmarks/runs/best_layout.py $R/layer_layouts.json --tokens 64) || BEST=fp16_lanes
echo "layer winner at 64 tokens: $BEST" | tee $R/best.txt
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
[ "$BEST" != fp16_lanes ] && TAILN=3 step tp120_c64_best 120 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
TAILN=3 step tp120_c64 120 python3 $TP --json $R/tp120_c64.json
