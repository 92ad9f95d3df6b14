#!/usr/bin/env bash
# Session 38, call 1 (~7 min, either card; wanted on an H200): session37_call4.sh (the batch-1
# defaults since session 37, WHOLE_STEPS 2 and gate_up's SCALES_T on 120b's GEMVs: their GPU tests
# and the fed A/B against the old defaults, masked_steps) and on 20b the same changes reaching the
# GEMVs that route themselves (whole_{2,4}_scales_t_routing: ROUTING_GEMV_CHANGES emptied); on an
# H200 then the batch-64 and -256 step profiles.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s38h200; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_route_in_experts.py -k "fp16 or whole or routes or from_logits" -rfE
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 5 --steps 32"
TAILN=6 step ab_120b 150 python3 $AB --models gpt-oss-120b --variants defaults,masked_steps --json $R/ab_120b.json
TAILN=8 step ab_20b 150 python3 $AB --models gpt-oss-20b --variants defaults,masked_steps,whole_2_scales_t_routing,whole_4_scales_t_routing --json $R/ab_20b.json
# the batch-64 and batch-256 steps kernel by kernel on the bar's card (never profiled on an H200)
grep -q H200 $R/gpu.txt && TAILN=34 step profile_b64_b256 170 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64,256 --context 1024 --top 24 --json $R/profile_b64_b256.json
