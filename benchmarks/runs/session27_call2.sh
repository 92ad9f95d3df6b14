#!/usr/bin/env bash
# Session 27, call 2 (right after call 1, on its warm H200; ~9 min): the C=64 bar's command with
# the clamped scales (GOSSAMER_CLAMP_SCALES=1, the previous code), the new default again, and the
# mma.sync K order (GOSSAMER_V2_SYNC_ORDER=1); then the batch-64 step profile and its graph
# timeline on the bar's card (never run on an H200).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s27c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
TAILN=3 GOSSAMER_CLAMP_SCALES=1 step tp120_c64_clamp 150 python3 $TP --json $R/tp120_c64_clamp.json
TAILN=3 step tp120_c64_new 90 python3 $TP --json $R/tp120_c64_new.json
TAILN=3 GOSSAMER_V2_SYNC_ORDER=1 step tp120_c64_sync 150 python3 $TP --json $R/tp120_c64_sync.json
TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
