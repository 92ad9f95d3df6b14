#!/usr/bin/env bash
# Session 35, call 5 (~2 min, either card): v2's per-pair outputs in bf16 on prefill tiles
# (V2_BF16_PARTIALS, new, on): the tall-tile GPU tests (120b shapes against the reference and
# against fp32 partials), then one 120b layer with it off and on at 1k-8k tokens
# (moe_switch_ab.py, interleaved; the slot sum included).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s35f; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py -k "tall_tiles and not gpu_120b_grouped_v2_fp16" -rfE
TAILN=12 step partials_ab 120 python3 benchmarks/moe_switch_ab.py --switch V2_BF16_PARTIALS --values 0,1 --tokens 1024,4096,8192 --rounds 3 --json $R/partials_ab.json
