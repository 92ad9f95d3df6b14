#!/usr/bin/env bash
# Session 13, call 1. #8: (a) the v2 grouped MoE with 8-row M-tiles (mma.sync instead of wgmma:
# 3.88 instructions a weight offline against 4.17) - its GPU test, then the layer timed at 64, 256
# and 1024 tokens against the default 16-row tiles; (b) where gpt-oss-20b's batch-1 step goes inside
# its CUDA graph: fusion_ab's knock-outs (one part of every layer left out of the graph; timing
# only), interleaved with the defaults.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s13c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s13c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=4 step v2_test 120 python3 -m pytest -m gpu tests/kernels/test_moe_mxfp4.py -k grouped_v2 -p no:cacheprovider -q --tb=short
TAILN=16 step v2_block_m 150 python3 benchmarks/moe_grouped_sweep.py --block-ms 8,16 --warps 4,8 --tokens 64 --confirm 256,1024 --json $R/v2_block_m.json
TAILN=12 step ko_20b 240 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,ko_norms,ko_qkv,ko_attention,ko_o,ko_router,ko_experts,ko_unembed --interleave --fed --rounds 3 --steps 32 --json $R/ko_20b.json
