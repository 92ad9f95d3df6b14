#!/usr/bin/env bash
# Session 22, call 1: where the batch-64 decode step of 120b goes (step_profile.py, never run at
# batch 64 before), then the C=64 bar's command with v2's 8-group 8-row tile (session 21's call 5;
# on an H100 with --kv-cache-gib 10, as its default KV budget does not hold 64 x 2k tokens).
# On an H200 it also re-times batch 1 for README (decode_speed.py, 120b and 20b, 1k and 8k).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s22c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s22c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=45 step profile120_b64 200 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 24 --json $R/profile120_b64.json
KV=""; grep -q H200 $R/gpu.txt || KV="--kv-cache-gib 10"
TAILN=6 step tp120_c64 300 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 $KV --json $R/tp120_c64.json
if grep -q H200 $R/gpu.txt; then
  TAILN=14 step decode_b1 200 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
fi
