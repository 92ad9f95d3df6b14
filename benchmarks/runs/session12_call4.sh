#!/usr/bin/env bash
# Session 12, call 4: test_guard's GPU test once more (it passed in call 3 at 0.95x; a second
# reading on a fresh machine before #7 is resolved).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c4; return $rc; }
TAILN=4 step guard_test 200 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=short
