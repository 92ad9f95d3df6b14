#!/usr/bin/env bash
# Session 37, call 2: on an H200, the thirty-fifth session's session35_h200.sh (the word layouts
# where the MoE is issue-bound, README's C=64 and C=256; ~9 min); on an H100 (where session 33 ran
# the layouts), the batch-1 knock-out table for gpt-oss-120b (fusion_ab.py; until now only 20b's,
# session 13), which prices the small launches before any fusion is written (NOTES, thirty-sixth
# session's view, item 2); ~5 min.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    exec bash benchmarks/runs/session35_h200.sh
fi
R=/tmp/s37c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KO=defaults,ko_norms,ko_attention,ko_router,ko_experts,ko_down,ko_qkv,ko_o
TAILN=14 step ko_120b 420 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants $KO --interleave --fed --rounds 2 --steps 32 --json $R/ko_120b.json
