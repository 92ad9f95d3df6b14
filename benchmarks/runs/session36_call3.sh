#!/usr/bin/env bash
# Session 36, calls 3-4 (~1 min each on the warm H100): the fed batch-1 step read kernel by kernel
# inside its CUDA graph (graph_timeline.py), the first such reading since session 17 (H200) and
# after the pruning: where the 650 tok/s aim's time goes now (an H100: the shares, not the H200's
# numbers). Call 3 ran MODELS=gpt-oss-120b, call 4 MODELS=gpt-oss-20b.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s36c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for M in ${MODELS:-gpt-oss-120b gpt-oss-20b}; do
    TAILN=20 step timeline_${M#gpt-oss-} 300 python3 benchmarks/graph_timeline.py --model $M --top 30 --json $R/timeline_${M#gpt-oss-}.json
done
