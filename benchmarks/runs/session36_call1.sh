#!/usr/bin/env bash
# Session 36, call 1 (~8 min, either card): the GPU tests of the code paths the session's pruning
# of lost experiments touched (v2's 8-row tiles and the routing kernel's layouts, the batch-1
# expert GEMVs routing themselves, attention's split rule, the whole model on the Triton ops),
# then the grouped GEMV's grid rows capped (session35_next.sh's sweep: LOOP_M_ROWS at 16 and 32
# tokens).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s36c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step gpu_tests 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_route_in_experts.py tests/kernels/test_triton_model.py tests/kernels/test_attention.py -k "120b_grouped_v2_sync or cuda_graph or test_gpu_120b_matches or routed_paths or test_triton_model or test_attention" -rfE
TAILN=6 step gemv_tests 90 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_grouped_gemv.py -k "looping or test_gpu_120b_matches" -rfE
TAILN=14 step loop_rows_ab 120 python3 benchmarks/moe_switch_ab.py --switch moe_grouped_gemv.LOOP_M_ROWS --values 0,32,48,64,96 --tokens 16,32 --rounds 3 --json $R/loop_rows_ab.json
