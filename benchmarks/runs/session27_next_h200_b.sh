#!/usr/bin/env bash
# For the next H200, after session27_next_h200_a.sh on the same warm machine (~4 min): the
# batch-64 step profile and its graph timeline on the bar's card (never run on an H200), and the
# C=64 bar's command with the mma.sync K order (GOSSAMER_V2_SYNC_ORDER=1) if a's layer A/B
# favours it there.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27nb; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=3 GOSSAMER_V2_SYNC_ORDER=1 step tp120_c64_sync 150 python3 $TP --json $R/tp120_c64_sync.json
