#!/usr/bin/env bash
# Session 34, call 3 (~6 min, either card): the Gluon MoE in half-steps (4 wgmmas in flight while
# the next 4's weights unpack: 125 registers, two programs of 8 warps an SM, offline). Call 2 found
# the earlier version at v2's speed only when held to 2 programs an SM (with ptxas serializing).
# GPU tests of the new loop; the layer A/B at 2k-8k tokens (2 rounds); if it beats v2 at 8k, the
# prefill step profile with it (WITH_V2=1: and without; C=256 left out: ~600 s of device time were
# left; call 1 profiled v2 on an H100: 229.5 ms).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s34c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_gluon.py -x -rfE -k "fp16_lanes-64-8 or hf-64 or 700 or switched or 64-4"
TAILN=14 step gluon_ab 150 python3 benchmarks/gluon_moe_ab.py --tokens 2048,4096,8192 --rounds 2 --variants v2,gluon64 --json $R/gluon_ab.json
if BEST=$(python3 benchmarks/runs/best_gluon.py $R/gluon_ab.json --tokens 8192); then
  echo "best: $BEST" | tee $R/best.txt
  TAILN=8 step prefill_gluon 120 env GOSSAMER_MOE_GLUON=1 $BEST python3 benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024 --timed-steps 5 --top 4 --json $R/prefill_gluon.json
  [ "${WITH_V2:-0}" = 1 ] && TAILN=8 step prefill_v2 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024 --timed-steps 5 --top 4 --json $R/prefill_v2.json
else
  echo "no Gluon variant beat v2 at 8192 tokens ($BEST)" | tee $R/best.txt
fi
