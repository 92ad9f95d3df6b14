#!/usr/bin/env bash
# Session 9, call 5 (the last ~100 s of device time; commit: the one that adds this file): auto
# against no speculation on mini at batch 8 with the guard's plain windows measuring only their
# tail and the speculator's idle steps lighter (db331c2), engines built first and runs interleaved.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s9c5; mkdir -p $R
timeout 95 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 8 --max-tokens 512 --runs 3 --interleave --json $R/spec_e2e.json > $R/spec_e2e.log 2>&1
echo "exit $?" >> $R/spec_e2e.log
grep -v "warming\|loading" $R/spec_e2e.log | tail -12
tar czf "$OUT/results.tgz" -C /tmp s9c5
