#!/usr/bin/env bash
# Session 6, call 4: why tests/kernels/test_triton_model.py failed with the expert-grouped GEMV
# on: that kernel alone on the test model's shapes in bf16, the model test with the defaults
# (grouped GEMV off again), and the model test with it on.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s6c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s6c4; return $rc; }
TAILN=12 step gg_small 50 python3 -m pytest -m gpu "tests/kernels/test_moe_grouped_gemv.py::test_gpu_small_model_shapes_bf16" -p no:cacheprovider -q --tb=line -rA
TAILN=6 step model_default 60 python3 -m pytest -m gpu tests/kernels/test_triton_model.py -p no:cacheprovider -q --tb=line
GOSSAMER_GROUPED_GEMV_MAX_PAIRS=128 GOSSAMER_DECODE_MAX_PAIRS=32 TAILN=6 step model_gg_on 50 python3 -m pytest -m gpu tests/kernels/test_triton_model.py -k greedy -p no:cacheprovider -q --tb=line
