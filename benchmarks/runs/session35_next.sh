#!/usr/bin/env bash
# Written in session 35 for the next (~3 min, either card; not run): the grouped GEMV's grid rows
# capped so that programs loop over the M-tiles (moe_grouped_gemv.LOOP_M_ROWS), at the decode
# batches it serves (16 and 32 tokens: 64 and 128 rows of possible tiles for ~52 and ~89 real
# ones), one 120b layer interleaved; its GPU tests first. Rule: a cap that takes >= 2% off both
# layers becomes the default, then decode_speed.py at batch 16 and 32 confirms it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s35next; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 90 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_grouped_gemv.py -k "looping or test_gpu_120b_matches" -rfE
TAILN=14 step loop_rows_ab 120 python3 benchmarks/moe_switch_ab.py --switch moe_grouped_gemv.LOOP_M_ROWS --values 0,32,48,64,96 --tokens 16,32 --rounds 3 --json $R/loop_rows_ab.json
