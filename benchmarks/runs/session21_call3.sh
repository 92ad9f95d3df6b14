#!/usr/bin/env bash
# Session 21, call 3: v2's new tile at 8 rows (GROUPS_PER_STEP 8: call 2's sweep, one layer
# 735 -> 630 us at 64 tokens). (1) v2's GPU tests (120b shapes, graphs); (2) 120b decode steps at
# batch 64 and 32, 1k context, with the new tile and with GOSSAMER_V2_M8_GROUPS=4 (the old one),
# each in its own process (the tile is read at import). ~6 min.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s21c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s21c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=4 step gpu_tests 150 python3 -m pytest tests/kernels/test_moe_mxfp4.py -m gpu -k "v2 or graph" -p no:cacheprovider -q --tb=short -rf
for groups in 8 4; do
  TAILN=6 step "decode_b64_g${groups}_$(date +%s)" 170 env GOSSAMER_V2_M8_GROUPS=$groups python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 32,64 --steps 32 --json $R/decode_g${groups}_$(date +%s).json
done
