#!/usr/bin/env bash
# Session 5, call 2: the helpers' GPU tests (overlapped scheduling, tree graphs, cost calibration)
# and auto speculation on mini with the costs timed at start-up.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s5c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s5c2; return $rc; }
TAILN=10 step gpu_tests 240 python3 -m pytest -m gpu tests/engine/test_async_scheduling_gpu.py tests/spec/test_tree_graphs_gpu.py tests/spec/test_calibrate.py -p no:cacheprovider -q -rA --tb=line
TAILN=20 step spec_auto 200 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-fixed --batch-sizes 1,8 --max-tokens 256 --json $R/spec_auto.json
