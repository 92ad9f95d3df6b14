#!/usr/bin/env bash
# Session 24, call 3: NOT RUN (refused: no machine, either kind). The C=64 bar's command with 64-row tiles from 64 pairs an expert (the 64
# 8k-token prefill chunks of the run take them). On an H200 (never measured there since session
# 13): with the default KV budget, then the batch-64 step profile and batch 1 for the README. On
# an H100: with --kv-cache-gib 10 (its default budget preempts), against session 22's 2,152.4,
# and the same with the tall tiles from 128 pairs (session 23's threshold).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s24c3; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024"
if grep -q H200 $R/gpu.txt; then
  TAILN=6 step tp120_c64 170 python3 $TP --json $R/tp120_c64.json
  TAILN=45 step profile120_b64 120 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 24 --json $R/profile120_b64.json
  TAILN=14 step decode_b1 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
else
  TAILN=6 step tp120_c64_kv10 170 python3 $TP --kv-cache-gib 10 --json $R/tp120_c64_kv10.json
  TAILN=6 step tp120_c64_kv10_tall128 170 env GOSSAMER_V2_TALL_MIN_PAIRS=128 python3 $TP --kv-cache-gib 10 --json $R/tp120_c64_kv10_tall128.json
fi
