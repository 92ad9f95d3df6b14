#!/usr/bin/env bash
# Session 6, call 1: GPU tests of the L2 prefetch and the expert-grouped GEMV now on, an A/B of the
# prefetch at batch 1 (120b, 20b) on one machine, and the per-kernel profile with it on.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s6c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s6c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
TAILN=8 step gpu_tests 140 python3 -m pytest -m gpu tests/kernels/test_l2_prefetch.py tests/kernels/test_moe_grouped_gemv.py "tests/kernels/test_triton_model.py::test_l2_prefetch_changes_no_bit" -p no:cacheprovider -q --tb=short
TAILN=14 step fusion_ab 340 python3 benchmarks/fusion_ab.py --models gpt-oss-120b,gpt-oss-20b --variants no_prefetch,l2_prefetch,router_norm_folded,prefetch_router_norm --rounds 2 --steps 48 --json $R/fusion_ab.json
GOSSAMER_L2_PREFETCH=1 TAILN=40 step profile 70 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --top 24 --json $R/profile_prefetch.json
