#!/usr/bin/env bash
# Nsight Compute on one eager decode step (benchmarks/ncu_step.py says what and why):
#     bash benchmarks/ncu_step.sh MODEL BATCH DIR [extra ncu options, e.g. -k regex:_v2_]
# writes DIR/ncu_MODEL_bBATCH.csv (ncu's raw page) and prints the table. Clocks stay as they are
# (--clock-control none: .library/device/METHOD.md).
set -euo pipefail
model=$1 batch=$2 dir=$3; shift 3
mkdir -p "$dir"
csv="$dir/ncu_$(basename "$model")_b$batch.csv"
ncu --clock-control none --profile-from-start off --target-processes all \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis "$@" \
    --csv --page raw --log-file "$csv" \
    python3 benchmarks/ncu_step.py run --model "$model" --batch "$batch"
python3 benchmarks/ncu_step.py summarize "$csv"
