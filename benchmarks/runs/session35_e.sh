#!/usr/bin/env bash
# Session 35, call 5 (~6 min, either card): the split with its GEMV grid cut to 16 (or 32) rows of
# programs that take the small experts in turn (V2_GEMV_M_PROGRAMS, LOOP_M; new): its GPU tests
# (120b shapes, a CUDA graph replay), the layer A/B at 1 and 3 pairs an expert and at C=64's
# routings against v2 and the first version (tokens_per_expert_ab.py), then README's C=64 with
# the fastest split at random T=64 against the default when it beats v2 there by >= 1%.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s35e; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=6 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py -k "small_experts or split_schedule or test_gpu_120b_matches or test_gpu_cuda_graph_replay and not v2" -rfE
TAILN=26 step tokens_per_expert 130 python3 benchmarks/tokens_per_expert_ab.py --per-expert 1,3 --rounds 3 --json $R/tokens_per_expert.json
ENVS=$(python3 benchmarks/runs/best_split.py $R/tokens_per_expert.json)
echo "split for C=64: ${ENVS:-none}" | tee $R/best.txt
[ -z "$ENVS" ] && exit 0
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64"
TAILN=3 step tp120_c64_split 100 env $ENVS python3 $TP --json $R/tp120_c64_split.json
TAILN=3 step tp120_c64 100 python3 $TP --json $R/tp120_c64.json
