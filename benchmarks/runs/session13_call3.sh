#!/usr/bin/env bash
# Session 13, call 3. #8 after this session's default changes (batch-1 router GEMV on whole rows,
# QKV on the tensor-core GEMV at M = 1, v2's M-tile twice the mean pairs an expert with warps by
# tile): the GPU tests of those kernels and of the whole model; 20b and 120b at batch 1 in the graph
# against the old GEMV choices and with down's first weights before its PDL wait (EARLY); 120b at
# concurrency 64.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s13c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s13c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels/test_gemv.py tests/kernels/test_moe_mxfp4.py tests/kernels/test_triton_model.py -p no:cacheprovider -q --tb=short
TAILN=8 step ab_20b 130 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,old_gemv,qkv_fma,router_dot,down_early --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=6 step ab_120b 150 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,old_gemv,down_early --interleave --fed --rounds 4 --steps 32 --json $R/ab_120b.json
TAILN=3 step tp120_c64 130 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
