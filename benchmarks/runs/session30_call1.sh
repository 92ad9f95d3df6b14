#!/usr/bin/env bash
# Session 30, call 1: whichever card comes. An H200 runs session29_next_h200.sh (README's C=64
# and C=256 with today's default, the K-order x maxnreg layer A/B, ncu); an H100 runs
# session29_next_h100.sh (the 8-row tile re-sweep in the mma.sync order, maxnreg, ncu).
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    exec bash benchmarks/runs/session29_next_h200.sh
fi
exec bash benchmarks/runs/session29_next_h100.sh
