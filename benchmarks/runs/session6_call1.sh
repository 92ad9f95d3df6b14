#!/usr/bin/env bash
# Session 6, call 1: GPU tests of the L2 prefetches, the expert-grouped GEMV (now on) and the
# pinned uploads, then an A/B of the prefetch variants at batch 1 on 120b on one machine.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s6c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s6c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
TAILN=10 step gpu_tests 120 python3 -m pytest -m gpu tests/kernels/test_l2_prefetch.py "tests/kernels/test_triton_model.py::test_l2_prefetch_changes_no_bit" tests/kernels/test_moe_mxfp4.py -k "prefetch or graph_replay or both_paths" -p no:cacheprovider -q --tb=short
TAILN=10 step upload_tests 60 python3 -m pytest -m gpu tests/runner/test_pinned_uploads_gpu.py -p no:cacheprovider -q --tb=short
TAILN=20 step fusion_ab 360 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants no_prefetch,l2_prefetch,prefetch_down,prefetch_down_protected,all_prefetch,router_norm_folded --rounds 2 --steps 48 --json $R/fusion_ab.json
