#!/usr/bin/env bash
# Session 4, second device call: GPU tests of the new fusions (norm in the GEMV prologue, RoPE + KV
# write in attention, the repacked MXFP4 layout) and their batch-1 A/B on one loaded 120b model.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s4c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s4c2; return $rc; }
TAILN=25 step gpu_tests 290 python3 -m pytest tests/kernels tests/spec tests/test_weights.py -m gpu -q -p no:cacheprovider -rf --tb=line --durations=6
TAILN=20 step fusion_ab 270 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --rounds 2 --json $R/fusion_ab.json
