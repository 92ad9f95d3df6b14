#!/usr/bin/env bash
# Session 3 last device call: GPU kernel tests with the failures listed, batch-1 decode with the
# swept defaults now in the source, and the 1k-in/1k-out engine throughput rows (120b).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s3d; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s3d; return $rc; }
TAILN=25 step gpu_tests 250 python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider -rf --tb=line --durations=8
TAILN=8 step decode 70 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1 --steps 64 --no-warmup --json $R/decode.json
TAILN=16 step throughput 265 python3 benchmarks/throughput.py --models gpt-oss-120b --json $R/throughput.json
