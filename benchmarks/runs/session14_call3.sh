#!/usr/bin/env bash
# Session 14, call 3. #8: the chain floor (benchmarks/chain_floor.py: the batch-1 step's kernels as
# plain streaming kernels of the same bytes, chained with PDL in one graph, and each kind's
# marginal cost there), then batch-1 decode with today's defaults at 1k and 8k context.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s14c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=30 step chain_floor 240 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json
TAILN=12 step decode_b1 280 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
