#!/usr/bin/env bash
# Session 9, call 3 (commit: the one that adds this file): speculation on mini with every method's
# engine built first and the runs interleaved (the host's speed drifted between call 2's rows), a
# host profile of plain-mode steps with and without the speculator at batch 8, decode speed of
# both models with the key-tile prefetch on by default, and decode attention's GPU tests with it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s9c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s9c3; return $rc; }
TAILN=24 step spec_e2e 200 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-noguard --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
TAILN=4 step spec_profile 80 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 8 --max-tokens 512 --runs 1 --interleave --profile --json $R/spec_profile.json
TAILN=12 step decode 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1 --steps 64 --json $R/decode.json
TAILN=8 step gpu_tests 100 python3 -m pytest -m gpu tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py -p no:cacheprovider -q --tb=short -rf
