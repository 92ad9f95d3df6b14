#!/usr/bin/env bash
# Session 11, call 3 (commit: the one that adds this file): the whole GPU test suite on main
# (HostSlack and the guard's history since call 1's spec tests), then speculation on mini again,
# interleaved (a second sample of call 2's: the host's speed moves between machines).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s11c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s11c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=16 step gpu_tests 400 python3 -m pytest -m gpu tests -p no:cacheprovider -q --tb=short -rf --durations=10
TAILN=12 step spec_e2e 170 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
