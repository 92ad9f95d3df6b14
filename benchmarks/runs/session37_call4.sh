#!/usr/bin/env bash
# Session 37, call 4 (either card, ~5 min): the new batch-1 defaults (WHOLE_STEPS 2 and gate_up's
# SCALES_T where the routing kernel runs, i.e. 120b; the GEMVs that route themselves unchanged):
# the MoE and model GPU tests, then the fed batch-1 A/B against the old defaults (masked_steps) on
# both models, five rounds interleaved.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s37c4; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_route_in_experts.py -k "fp16 or whole or routes or from_logits" -rfE
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 5 --steps 32"
TAILN=6 step ab_120b 150 python3 $AB --models gpt-oss-120b --variants defaults,masked_steps --json $R/ab_120b.json
TAILN=6 step ab_20b 120 python3 $AB --models gpt-oss-20b --variants defaults,masked_steps --json $R/ab_20b.json
