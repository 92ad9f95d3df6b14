#!/usr/bin/env bash
# Session 8, call 6 (the last minute of device time, on the machine call 5 left warm; run as one
# command line): speculation on mini with the guard's index builds amortized (9f960d7).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/s8c6
timeout 100 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 256 --json $OUT/s8c6/spec_e2e.json 2>&1 | grep -v "warming\|loading" | tail -20
