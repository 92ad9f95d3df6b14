#!/usr/bin/env bash
# Session 34, call 4 (~4 min, either card): what bounds prefill's MoE at ~320 TFLOP/s (H100)?
# v2 and the Gluon kernel tie (call 3), so ncu on one gate_up launch of each at 8,192 tokens:
# speed of light (tensor pipe, L2 / DRAM / shared-memory throughput), warp states, occupancy.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s34c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
ncu --version | tail -1 | tee -a $R/gpu.txt
NCU="ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy -c 1"
AB="benchmarks/gluon_moe_ab.py --tokens 8192 --rounds 1"
TAILN=40 step ncu_v2 110 $NCU -k regex:_v2_gate_up python3 $AB --variants v2 --json $R/ab_v2.json
TAILN=40 step ncu_gluon 110 $NCU -k regex:^gate_up_kernel python3 $AB --variants gluon64 --json $R/ab_gluon.json
