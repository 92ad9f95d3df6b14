#!/usr/bin/env bash
# Session 8, call 5 (the last ~3 minutes of device time): speculation on mini with the guard's
# index builds amortized, the 120b batch-1 step once more (a third measurement against the 450
# bar), and the GPU tests of the last changes (down-only AHEAD, the guard's GPU test).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s8c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s8c5; return $rc; }
TAILN=16 step spec_e2e 70 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-noguard --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
TAILN=6 step decode_120b 55 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 128 --json $R/decode_120b.json
TAILN=8 step gpu_tests 60 python3 -m pytest -m gpu tests/kernels/test_moe_mxfp4.py -k "ahead or 120b or guard" tests/spec/test_guard.py -p no:cacheprovider -q --tb=short -rf
