#!/usr/bin/env bash
# Session 30, call 2 (~4 min, either card): where the 8-row v2 tile's warps wait, per SASS
# instruction. Session 28's ncu gave only kernel-wide stall averages (long_scoreboard 1.2,
# not_selected 1.2, wait 0.9, short_scoreboard 0.9, math_pipe_throttle 0.9 cycles an issue on
# an H100): whether long_scoreboard is the one-byte scale loads (LDG.U8, prefetched one step
# ahead) or the async copies' waits decides the next change. Nsight Compute's warp-state
# sampling (SourceCounters) attributes each sample to an instruction; the source page is
# exported as CSV and read on the CPU (`ncu_source.py`).
# 1. one 120b layer at 64 tokens, today's default (mma.sync order), gate_up and down: report;
# 2. the source pages as CSV (SASS with stall samples per instruction);

set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s30c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
ncu --version | tail -1 | tee -a $R/gpu.txt
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 1 --ab-stages 3 --ab-rounds 1"
NCU="ncu --clock-control none --target-processes all --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no"
TAILN=6 step src_default 150 $NCU -k regex:_v2_ -c 2 -o $R/src_default python3 $SW --ab-maxnreg 0
TAILN=4 step page_default 60 ncu --import $R/src_default.ncu-rep --page source --csv --print-source sass --log-file $R/src_default.csv
TAILN=30 step table_default 30 python3 benchmarks/ncu_source.py $R/src_default.csv --top 40
