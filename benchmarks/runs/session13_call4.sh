#!/usr/bin/env bash
# Session 13, call 4. #8: GPU tests of the kernels changed since call 3 (down's EARLY now on, the
# norm in the whole-row router GEMV's prologue, WHOLE_K tiles) and of the whole model; batch 1 in
# the graph, 20b and 120b: the post-attention norm folded into the whole-row router GEMV
# (gemv.FUSED_NORM_WHOLE_ROWS), down's EARLY off again, and the QKV / O GEMVs split for 4 or 16
# programs an SM instead of 8.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s13c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s13c4; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels/test_gemv.py tests/kernels/test_norm_linear.py tests/kernels/test_moe_mxfp4.py tests/kernels/test_triton_model.py -p no:cacheprovider -q --tb=short
TAILN=10 step ab_20b 150 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,router_norm_whole,down_late,qkv_ppsm4,qkv_ppsm16,o_ppsm4,o_ppsm16 --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=6 step ab_120b 150 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,router_norm_whole,down_late --interleave --fed --rounds 4 --steps 32 --json $R/ab_120b.json
