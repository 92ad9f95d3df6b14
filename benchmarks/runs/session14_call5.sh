#!/usr/bin/env bash
# Session 14, call 5. The whole GPU suite (benchmarks/gpu_tests.sh) on today's tree, first run
# since session 11 (the defaults changed in session 13: GEMV tiles, v2 M-tiles, down's EARLY);
# then QKV / O with the split partials added by a reduce kernel, or QKV unsplit, in the 20b graph.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s14c5; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step gpu_suite 450 bash benchmarks/gpu_tests.sh --durations=15
TAILN=8 step ab_20b 90 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_reduce,o_reduce,qkv_whole_k_s8 --interleave --fed --rounds 3 --steps 32 --json $R/ab_20b.json
