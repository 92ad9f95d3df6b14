#!/usr/bin/env bash
# Session 4, last device call (about 4 minutes of budget): the expert-grouped GEMV's GPU tests on
# its final code (call 4 ran out of time after 9), then its comparison rows again.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s4c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s4c5; return $rc; }
TAILN=12 step gg_tests 170 python3 -m pytest tests/kernels/test_moe_grouped_gemv.py -m gpu -p no:cacheprovider -rA --tb=line -q
TAILN=16 step gg_compare 60 python3 benchmarks/moe_grouped_gemv_sweep.py --tokens 16,32,64 --quick --json $R/gg_compare.json
