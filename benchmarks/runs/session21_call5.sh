#!/usr/bin/env bash
# Session 21, call 5: the C=64 bar's command with v2's new 8-row tile (GROUPS_PER_STEP 8):
# throughput.py, 120b, 64 users, 1k in / 1k out (session 13 on an H200: 2,347.5 output tok/s).
# On an H200 it also re-times batch 1 for README (decode_speed.py, 120b and 20b, 1k and 8k).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s21c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s21c5; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step tp120_c64 330 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
if grep -q H200 $R/gpu.txt; then
  TAILN=14 step decode_b1 250 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
fi
# It ran on an H100, whose default KV cache (1.33 GiB beside 60.77 GiB of weights) did not fit the
# 64 requests (29 preemptions). Two later calls on the same warm machine, logs beside this one's:
# python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 \
#   --output-len 1024 --kv-cache-gib 10 --json tp120_c64_kv10.json
# GOSSAMER_V2_M8_GROUPS=4 python3 benchmarks/throughput.py ... --json tp120_c64_kv10_g4.json
