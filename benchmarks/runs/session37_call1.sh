#!/usr/bin/env bash
# Session 37, call 1 (either card, ~8 min; what finishes comes back, most wanted first): the batch-1
# MoE GEMVs' whole steps loaded without predicates (DECODE_FP16_GATE_UP / _DOWN's WHOLE_STEPS,
# new; offline -11 to -18% of gate_up's instructions, -22 to -25% of down's): their GPU tests
# (bits equal to the masked loop on 120b shapes), then the fed batch-1 graph A/B on gpt-oss-120b
# and 20b (fusion_ab.py, interleaved). Rule: a variant that takes >= 1% off both models' steps
# in every round becomes the default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s37c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 100 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_mxfp4.py -k "whole_steps or fp16_down_loads or gate_up_routes_early" -rfE
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 3 --steps 32"
TAILN=10 step ab_120b 320 python3 $AB --models gpt-oss-120b --variants defaults,whole_1,whole_4,whole_4_scales_t --json $R/ab_120b.json
TAILN=10 step ab_20b 150 python3 $AB --models gpt-oss-20b --variants defaults,whole_4,whole_4_scales_t --json $R/ab_20b.json
