#!/usr/bin/env bash
# Written in session 33 for an H200 (no H200 came; ~7 min, runs on either card): the word layouts'
# layer A/B at 1, 64, 256 and 4096 tokens (session 33 ran session32_call1.sh's on an H100: -1.1%
# at 64 tokens, -3.3% at 4096, +1.4-5.3% at 1); prefill's 128-row tiles held to 128 or 168
# registers (two CTAs an SM at 128, with ~12 spill loads and stores a loop offline) against the
# 64-row default at 8,192 and 4,096 tokens; then README's C=64 in the layer's winner at 64 tokens
# and in the default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s33h200; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=18 step layer_layouts 100 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256,4096 --rounds 3 --json $R/layer_layouts.json
TAILN=14 step prefill_tiles 90 python3 benchmarks/moe_grouped_sweep.py --block-ms 64,128 --warps 8 --maxnregs 0,128,168 --tokens 8192 --confirm 4096 --json $R/prefill_tiles.json
BEST=$(python3 benchmarks/runs/best_layout.py $R/layer_layouts.json --tokens 64) || BEST=fp16_lanes
echo "layer winner at 64 tokens: $BEST" | tee $R/best.txt
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
[ "$BEST" != fp16_lanes ] && TAILN=3 step tp120_c64_best 140 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
TAILN=3 step tp120_c64 140 python3 $TP --json $R/tp120_c64.json
