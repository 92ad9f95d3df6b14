#!/usr/bin/env bash
# Session 38, call 5 (either card, ~3 min; a fresh machine leaves little of the session's budget):
# the ROPE_KV attention launch loads its first key tile early only where the launch fits on the
# SMs at the early form's 2 programs an SM (attention.EARLY_KV_PROGRAMS_PER_SM, new): the
# batch-64 step in its graph (call 4 had 79 us a full layer), then 120b's fed batch-1 step at 8k
# context (512 programs: early no longer) against the early tile at any grid (early_kv_any).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s38e; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=24 step timeline_b64 150 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --top 12 --json $R/timeline_b64.json
TAILN=6 step ab_8k 150 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --context 8192 --interleave --fed --rounds 3 --steps 32 --variants defaults,early_kv_any --json $R/ab_8k.json
