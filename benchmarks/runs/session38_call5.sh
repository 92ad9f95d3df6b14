#!/usr/bin/env bash
# Session 38, call 5 (either card, ~4 min; written for a call that did not come): the ROPE_KV
# attention launch loading its first key tile early only where the launch fits on the SMs at the
# early form's 2 programs an SM (GOSSAMER_ATTN_EARLY_KV_PROGRAMS_PER_SM=2, off by default): the
# batch-64 step in its graph with and without it (session 38's call 4 had 79 us a full layer),
# then 120b's fed batch-1 step at 8k context (512 programs: no early tile with it) and at 1k
# (128 programs: unchanged by construction) against the default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s38e; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TL="benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --top 12"
TAILN=14 step timeline_b64_fits 150 env GOSSAMER_ATTN_EARLY_KV_PROGRAMS_PER_SM=2 python3 $TL --json $R/timeline_b64_fits.json
TAILN=14 step timeline_b64 150 python3 $TL --json $R/timeline_b64.json
AB="benchmarks/fusion_ab.py --models gpt-oss-120b --interleave --fed --rounds 3 --steps 32 --variants defaults,early_kv_fits"
TAILN=6 step ab_8k 150 python3 $AB --context 8192 --json $R/ab_8k.json
TAILN=6 step ab_1k 120 python3 $AB --context 1024 --json $R/ab_1k.json
