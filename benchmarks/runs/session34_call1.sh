#!/usr/bin/env bash
# Session 34, call 1 (~9 min, either card; what finishes comes back): the Gluon prefill MoE
# (gossamer/kernels/moe_gluon.py), first time on a GPU. Its GPU tests against the torch reference
# and v2; one 120b layer at 1k-8k tokens, v2 against Gluon at 64- and 128-token tiles
# (gluon_moe_ab.py, interleaved, each checked); then the prefill step profile (8 prompts x 1k)
# with and without GOSSAMER_MOE_GLUON=1.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s34c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step gpu_tests 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_gluon.py -x -rfE
TAILN=20 step gluon_ab 150 python3 benchmarks/gluon_moe_ab.py --tokens 1024,2048,4096,8192 --rounds 3 --json $R/gluon_ab.json
PP="benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024 --timed-steps 5 --top 16"
TAILN=24 step prefill_gluon 150 env GOSSAMER_MOE_GLUON=1 python3 $PP --json $R/prefill_gluon.json
TAILN=24 step prefill_v2 150 python3 $PP --json $R/prefill_v2.json
