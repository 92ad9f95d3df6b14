#!/usr/bin/env bash
# Session 32, the short call for what device time was left (~4 min): session32_call1.sh's layer A/B
# alone, at 1 token (the batch-1 GEMVs), 64 (v2's 8-row tile: C=64) and 256 (16 rows: C=256).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s32short; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=14 step layer_layouts 280 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256 --rounds 2 --json $R/layer_layouts.json
