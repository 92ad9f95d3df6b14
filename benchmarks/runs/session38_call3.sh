#!/usr/bin/env bash
# Session 38, calls 3 and 4 (H100, warm, ~1 min each): the fed 120b step read in its CUDA graph
# (graph_timeline.py) with the session-37 batch-1 defaults (call 3, batch 1) and at batch 64, the
# C=64 bar's decode step (call 4: BATCH=64 bash benchmarks/runs/session38_call3.sh).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
B=${BATCH:-1}
R=/tmp/s38c; [ "$B" = 1 ] || R=/tmp/s38d
. benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
NAME=timeline_120b; [ "$B" = 1 ] || NAME=timeline_120b_b$B
TAILN=24 step $NAME 300 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch $B --top 30 --json $R/$NAME.json
