#!/usr/bin/env bash
# Session 35, call 3 (~6 min, either card): v2's quick exit for programs past the last M-tile and
# the tighter grid bound (V2_QUICK_EXIT, new, on): the v2 GPU tests with it, one 120b layer with it
# on and off at 64 / 256 / 4096 tokens (moe_switch_ab.py, interleaved), README's C=64 off and on;
# on an H200 also the word layouts' layer A/B at 64 tokens (the one experiment no H200 has run).
# Ran on an H100: no gain (+0.2% a layer, C=64 within noise), so V2_QUICK_EXIT was reverted and
# this script no longer runs as written (moe_mxfp4 has no V2_QUICK_EXIT).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s35c; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "test_gpu_120b_grouped_v2 and not tall and not fp16 or cuda_graph" -rfE
TAILN=12 step quick_exit_ab 90 python3 benchmarks/moe_switch_ab.py --switch V2_QUICK_EXIT --values 0,1 --tokens 64,256,4096 --rounds 3 --json $R/quick_exit_ab.json
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
TAILN=3 step tp120_c64_old 100 env GOSSAMER_V2_QUICK_EXIT=0 python3 $TP --json $R/tp120_c64_old.json
TAILN=3 step tp120_c64 100 python3 $TP --json $R/tp120_c64.json
grep -q H200 $R/gpu.txt && TAILN=14 step layer_layouts 100 python3 benchmarks/word_layouts_ab.py --tokens 64 --rounds 3 --json $R/layer_layouts.json
