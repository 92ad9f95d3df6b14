#!/usr/bin/env bash
# Session 21, call 4: with v2's 8-row tile at 8 groups a step, does v2 now beat the grouped GEMV
# (moe_grouped_gemv.py, up to GROUPED_GEMV_MAX_PAIRS = 128 pairs) at 16-32 tokens? One 120b
# MoE layer, each path at its defaults. ~1.5 min.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s21c4; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 300 python3 benchmarks/moe_grouped_gemv_sweep.py --tokens 16,24,32,48,64 --parts compare \
  --json $R/compare.json 2>&1 | tee $R/compare.log
tar czf "$OUT/results.tgz" -C /tmp s21c4
