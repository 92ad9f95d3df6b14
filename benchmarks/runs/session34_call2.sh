#!/usr/bin/env bash
# Session 34, call 2 (~8 min, either card): call 1 found the Gluon MoE right (10 GPU tests; every
# timed layer matched the reference) but 23-34% slower than v2 (H100), one CTA of 8 warps an SM
# at 173 registers against v2's two. Here: the GPU tests call 1 did not reach; the layer A/B at
# 4k and 8k tokens with 4-warp programs (2 or, at 168 registers, 3 an SM) and 8-warp ones held to
# 128 registers (2 an SM); if a variant beats v2 at 8k, the prefill step profile with it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s34c2; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_gluon.py -x -rfE -k "120b or switched or bad or 64-4"
TAILN=16 step gluon_ab 200 python3 benchmarks/gluon_moe_ab.py --tokens 4096,8192 --rounds 2 --variants v2,gluon64,gluon64w4,gluon64w4r168,gluon64r128,gluon128w4 --json $R/gluon_ab.json
if BEST=$(python3 benchmarks/runs/best_gluon.py $R/gluon_ab.json --tokens 8192); then
  echo "best: $BEST" | tee $R/best.txt
  TAILN=8 step prefill_best 150 env GOSSAMER_MOE_GLUON=1 $BEST python3 benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024 --timed-steps 5 --top 4 --json $R/prefill_best.json
else
  echo "no Gluon variant beat v2 at 8192 tokens ($BEST)" | tee $R/best.txt
fi
