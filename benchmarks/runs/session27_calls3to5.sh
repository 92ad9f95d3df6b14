#!/usr/bin/env bash
# Session 27, calls 3-5, as run (one after another on call 2's warm H100; written here from the
# device calls' command lines). Call 2's C=64 run with the new code was cut by its step's limit
# (100 s; the cold load took 77.6 s), so call 3 ran the pair again; call 4 the MoE GPU tests and
# batch 1 new / old; call 5 the grouped GEMV's GPU tests and the whole model on the Triton ops.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
case "${1:-3}" in
3)
    R=/tmp/s27c4; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
    TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 --kv-cache-gib 10"
    TAILN=3 step tp120_c64_new 110 python3 $TP --json $R/tp120_c64_new.json
    TAILN=3 GOSSAMER_MOE_OLD_UNPACK=1 step tp120_c64_old 80 python3 $TP --json $R/tp120_c64_old.json ;;
4)
    R=/tmp/s27c5; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
    TAILN=8 step gpu_tests_moe 200 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py
    TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 512 --concurrency 1 --kv-cache-gib 10"
    TAILN=2 step tp120_c1_new 60 python3 $TP --json $R/tp120_c1_new.json
    TAILN=2 GOSSAMER_MOE_OLD_UNPACK=1 step tp120_c1_old 70 python3 $TP --json $R/tp120_c1_old.json ;;
5)
    R=/tmp/s27c6; . benchmarks/runs/step.sh
    TAILN=6 step gpu_tests 200 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_grouped_gemv.py tests/kernels/test_triton_model.py ;;
esac
