#!/usr/bin/env bash
# Session 33, the H200 call for the last ~6 min of device time: the word layouts' layer A/B at 1,
# 64, 256 and 4096 tokens (session 32's call 1 ran it on an H100: -1.1% at 64 tokens, -3.3% at
# 4096, +1.4-5.3% at 1), then README's C=64 in the layer's winner at 64 tokens and in the default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s33h200; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=18 step layer_layouts 100 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256,4096 --rounds 3 --json $R/layer_layouts.json
BEST=$(python3 benchmarks/runs/best_layout.py $R/layer_layouts.json --tokens 64) || BEST=fp16_lanes
echo "layer winner at 64 tokens: $BEST" | tee $R/best.txt
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
[ "$BEST" != fp16_lanes ] && TAILN=3 step tp120_c64_best 140 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
TAILN=3 step tp120_c64 140 python3 $TP --json $R/tp120_c64.json
