#!/usr/bin/env bash
# Session 26, call 3: the dense projections at batch 17..64 on the Triton GEMV's new wide tiles
# (gemv.py "_wide" configs, on with GOSSAMER_GEMV_MAX_M=64; cuBLAS by default), in order of need:
# 1. H200 only: the batch-64 step profile of 120b (the C=64 bar's per-kernel times; never run
#    on an H200);
# 2. GPU tests: the projections at 17, 48 and 64 rows on the wide tiles, and the whole model on
#    the Triton ops with the wide tiles serving prompt chunks of 17..64 tokens;
# 3. gemv_sweep.py --wide: the wide tiles against cuBLAS, one projection at a time;
# 4. the C=64 bar's command with the wide tiles and with cuBLAS (the baseline on this card);
# 5. where a batch-64 step's time goes inside its graph (graph_timeline.py --batch 64: the
#    "gaps" of step_profile), with cuBLAS and with the wide tiles (the call's limit may cut these).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s26c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV=""
if grep -q H200 $R/gpu.txt; then
  TAILN=26 step profile120_b64 110 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
else
  KV="--kv-cache-gib 10"  # the H100's default budget preempts at C=64
fi
TAILN=8 GOSSAMER_GEMV_MAX_M=64 step gpu_tests_wide 150 bash benchmarks/gpu_tests.sh tests/kernels/test_gemv.py tests/kernels/test_triton_model.py -k "projections or triton_model or greedy or logits"
TAILN=30 step gemv_wide 100 python3 benchmarks/gemv_sweep.py --wide --out $R/gemv_wide.json
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 $KV"
TAILN=4 GOSSAMER_GEMV_MAX_M=64 step tp120_c64_wide 150 python3 $TP --json $R/tp120_c64_wide.json
TAILN=4 step tp120_c64 100 python3 $TP --json $R/tp120_c64.json
TL="benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 16"
TAILN=22 step timeline_b64 100 python3 $TL --json $R/timeline_b64.json
TAILN=22 GOSSAMER_GEMV_MAX_M=64 step timeline_b64_wide 80 python3 $TL --json $R/timeline_b64_wide.json
