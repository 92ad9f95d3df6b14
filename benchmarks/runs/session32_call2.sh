#!/usr/bin/env bash
# Session 32, call 2 (~8 min, the card call 1 left warm): README's C=256 in the layout that won
# call 1's layer at 64 tokens ($1) and in the default, C=64 in $1 a second time, then
# (added in session 33, before this ever ran) the first profile of a prefill step:
# step_profile.py --prefill 8x1024, one step of C=256's 1k prompts at the 8,192-token budget.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BEST=${1:?the layout to run}
R=/tmp/s32c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b"
TAILN=3 step tp120_c256_best 130 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --concurrency 256 --json $R/tp120_c256_best.json
TAILN=3 step tp120_c256 130 python3 $TP --concurrency 256 --json $R/tp120_c256.json
TAILN=3 step tp120_c64_best 90 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --concurrency 64 --json $R/tp120_c64_best.json
TAILN=30 step prefill_profile 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024 --timed-steps 5 --top 24 --json $R/prefill_profile.json
