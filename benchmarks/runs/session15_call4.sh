#!/usr/bin/env bash
# Session 15, call 4: call 3's 20b batch-1 decode_speed (cut off there by its time limit during the
# cold kernel warm-up), then the speculation GPU tests (verification steps of 2-8 tokens read the
# packed QKV / O copies).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s15c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s15c4; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=8 step decode_speed 240 python3 benchmarks/decode_speed.py --models gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_speed.json
TAILN=6 step spec_gpu_tests 200 python3 -m pytest -m gpu tests/spec -p no:cacheprovider -q --tb=short -rf
