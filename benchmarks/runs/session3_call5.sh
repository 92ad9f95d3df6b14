#!/usr/bin/env bash
# Session 3 fifth device call (the budget's remainder): speculative decoding after PDL.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s3e; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s3e; return $rc; }
TAILN=6 step spec_tests 100 python3 -m pytest tests/spec -m gpu -q -p no:cacheprovider -rf --tb=line
TAILN=20 step spec_e2e 150 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,ngram,suffix --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
TAILN=14 step verify_cost 90 python3 benchmarks/spec_decode.py verify-cost --model gpt-oss-120b --load-format dummy --batch-sizes 1 --ks 0,1,2,3,4,5,6,7 --context 1024 --json $R/verify.json
