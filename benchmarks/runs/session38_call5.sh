#!/usr/bin/env bash
# Session 38, call 5 (either card, ~4 min): why decode attention at batch 64 takes ~79 us a full
# layer in the graph (call 4's events: 1.72 TB/s for ~136 MB of KV at 1k context, H100) when
# session 22's sweep timed the kernel alone at 53.4 us. (1) the kernel alone today, at the
# default launch and at other tiles (kernels_attention.py --sweep-batch: the attention op without
# rope); (2) the batch-64 step in its graph with rope and the KV write as their own launch
# (attention.FUSE_ROPE_KV off), against call 4's fused step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
R=/tmp/s38e; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=30 step attn_b64 150 python3 benchmarks/kernels_attention.py --sweep-batch --batch-sizes 64 --contexts 1024 --num-splits auto --block-n 64,128 --warps 4,8 --stages 2,3
TAILN=24 step timeline_b64_unfused 200 python3 -c "
import sys
from gossamer.kernels import attention
attention.FUSE_ROPE_KV = False
import graph_timeline
graph_timeline.main(sys.argv[1:])
" --model gpt-oss-120b --batch 64 --top 30 --json $R/timeline_b64_unfused.json
