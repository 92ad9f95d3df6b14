#!/usr/bin/env bash
# Session 12, call 5 (call 4's warm machine): auto against none end to end on mini after the
# idle-tick path and the repay cap, the command of session 11's calls 2 and 3.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c5; return $rc; }
TAILN=12 step spec_e2e 200 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
