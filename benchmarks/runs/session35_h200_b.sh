#!/usr/bin/env bash
# Session 35, call 2 (~5 min, the machine call 1 left warm): batch-1 decode of 120b and 20b in
# the layout $1 against the default (fusion_ab.py, sequential rounds: the layouts repack the experts), for the rule's 20b >= 700
# half; then C=64 in $1 and the default a second time (one pair is within noise of 1-2%).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
BEST=${1:?the layout to run}
R=/tmp/s35h200b; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step b1_layouts 200 python3 benchmarks/fusion_ab.py --models gpt-oss-120b,gpt-oss-20b --variants defaults,$BEST --rounds 2 --steps 64 --json $R/b1_layouts.json
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
TAILN=3 step tp120_c64_best 100 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --json $R/tp120_c64_best.json
TAILN=3 step tp120_c64 100 python3 $TP --json $R/tp120_c64.json
# the first per-kernel profile of a batch-256 step (C=256's decode, 54% of its floor; only
# batch 64's has been read): where the 16-row tiles' step goes
TAILN=30 step profile_b256 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 256 --context 1024 --top 24 --json $R/profile_b256.json
