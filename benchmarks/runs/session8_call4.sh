#!/usr/bin/env bash
# Session 8, call 4 (the warm machine after call 3; run as one command line): the GPU tests call
# 2's time limit cut (norm, router+MoE, idle overlap, the MoE kernels), then where the 120b
# batch-1 step goes now (step_profile.py: the profiler serializes launches, so PDL overlap, e.g.
# attention's early first key tile, does not show in its per-kernel times).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/s8c4
(timeout 200 python3 -m pytest -m gpu tests/kernels/test_norm.py tests/kernels/test_router_moe.py tests/spec/test_idle_overlap.py tests/kernels/test_moe_mxfp4.py -p no:cacheprovider -q --tb=short -rf > $OUT/s8c4/gpu_tests.log 2>&1; echo "exit $?" >> $OUT/s8c4/gpu_tests.log)
tail -15 $OUT/s8c4/gpu_tests.log
timeout 150 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --json $OUT/s8c4/profile_120b.json > $OUT/s8c4/profile.log 2>&1
echo "exit $?"
grep -v "warming" $OUT/s8c4/profile.log | tail -30
