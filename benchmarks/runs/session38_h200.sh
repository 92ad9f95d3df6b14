#!/usr/bin/env bash
# Session 38, call 1 (~5 min, either card; wanted on an H200): session37_call4.sh (the batch-1
# defaults since session 37, WHOLE_STEPS 2 and gate_up's SCALES_T on 120b's GEMVs: their GPU tests
# and the fed A/B against the old defaults, masked_steps) and on 20b the same changes reaching the
# GEMVs that route themselves (whole_{2,4}_scales_t_routing: ROUTING_GEMV_CHANGES emptied).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s38h200; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_route_in_experts.py -k "fp16 or whole or routes or from_logits" -rfE
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 5 --steps 32"
TAILN=6 step ab_120b 150 python3 $AB --models gpt-oss-120b --variants defaults,masked_steps --json $R/ab_120b.json
TAILN=8 step ab_20b 150 python3 $AB --models gpt-oss-20b --variants defaults,masked_steps,whole_2_scales_t_routing,whole_4_scales_t_routing --json $R/ab_20b.json
