#!/usr/bin/env bash
# Session 32, call 1 (~9 min, either card; what finishes comes back): the MXFP4 word layouts
# (mxfp4.LANE_LAYOUTS). One 120b MoE layer in each layout at 1, 64, 256 and 4096 tokens
# (word_layouts_ab.py, each checked against the torch reference); README's C=64 in the layout that
# won the layer at 64 tokens, then the default; batch-1 decode of 120b and 20b in each layout
# (fusion_ab.py, sequential: the variants repack the experts in place); last, the layouts' GPU
# tests (the tiny kernel tests compiled, and 120b shapes through both default paths).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s32c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=18 step layer_layouts 150 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256,4096 --rounds 2 --json $R/layer_layouts.json
BEST=$(python3 benchmarks/runs/best_layout.py $R/layer_layouts.json --tokens 64) || BEST=fp16_lanes
echo "layer winner at 64 tokens: $BEST" | tee $R/best.txt
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
[ "$BEST" != fp16_lanes ] && TAILN=3 step tp120_c64_best 90 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
TAILN=3 step tp120_c64 90 python3 $TP --json $R/tp120_c64.json
LANES=lanes_12_10,lanes_13_9,lanes_16_8
TAILN=8 step b1_layouts 200 python3 benchmarks/fusion_ab.py --models gpt-oss-120b,gpt-oss-20b --variants defaults,$LANES --rounds 2 --steps 64 --json $R/b1_layouts.json
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py -k "repack" -rfE
