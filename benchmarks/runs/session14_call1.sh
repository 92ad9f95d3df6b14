#!/usr/bin/env bash
# Session 14, call 1. #8: whole-slice L2 prefetches at batch 1. Every program of the batch-1
# GEMVs sends all of its weight bytes to L2 at once (the dense QKV / O GEMVs before their PDL wait,
# MoE gate_up once it has read its expert, down before its wait, with its scales), instead of
# keeping two steps in flight in registers. GPU tests of the changed kernels first; then the
# step in the graph, 20b and 120b, interleaved and fed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s14c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_gemv.py -p no:cacheprovider -q --tb=short
TAILN=12 step ab_20b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,gate_up_pf_all,down_pf_all,moe_pf_all,qkv_pf_all,o_pf_all,dense_pf_all,all_pf --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=8 step ab_120b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,moe_pf_all,dense_pf_all,all_pf --interleave --fed --rounds 4 --steps 32 --json $R/ab_120b.json
