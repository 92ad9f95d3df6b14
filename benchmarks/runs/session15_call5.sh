#!/usr/bin/env bash
# Session 15, call 5: chain_floor with the experts repacked by program (all_experts_packed beside
# call 3's all_experts_tiled: how much of the MoE GEMVs' read-pattern cost a repack would win),
# then the speculation GPU tests (call 4 ran 15 before its limit).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s15c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s15c5; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step chain_floor 110 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json
TAILN=30 step spec_gpu_tests 250 python3 -m pytest -m gpu tests/spec -p no:cacheprovider -q --tb=short -rf --durations=20
