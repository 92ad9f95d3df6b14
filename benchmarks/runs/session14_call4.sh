#!/usr/bin/env bash
# Session 14, call 4. #8: call 3's chain floor ran fastest with 4 programs an SM of 8 warps and
# 16 KB tiles; the batch-1 QKV / O GEMVs run 8 one-warp programs an SM with 2 KB tiles. Wider
# tensor-core tiles for QKV and O (fusion_ab.py WIDE_TILES), in the 20b step's graph, interleaved.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s14c4; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=16 step ab_20b 330 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_32x64w2p4,qkv_64x64w4p4,qkv_64x64w4p2,qkv_32x128w4p4,qkv_64x128w4p2,qkv_128x64w8p2,o_32x64w2p4,o_64x64w4p4,o_64x64w4p2,o_32x128w4p4,o_64x128w4p2,o_128x64w8p2 --interleave --fed --rounds 3 --steps 32 --json $R/ab_20b.json
