#!/usr/bin/env bash
# Session 4, first device call: sweep the grouped MoE v2 tile configs at batch 64 (the
# concurrency-64 bar), confirm at 256 and 1024 tokens, then whole decode steps with the best.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s4c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s4c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
TAILN=20 step grouped_sweep 330 python3 benchmarks/moe_grouped_sweep.py --tokens 64 --confirm 256,1024 --json $R/grouped_sweep.json
TAILN=10 step decode 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1,32,64,256 --steps 16 --grouped-sweep $R/grouped_sweep.json --json $R/decode.json
