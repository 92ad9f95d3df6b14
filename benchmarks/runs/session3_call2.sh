#!/usr/bin/env bash
# Session 3 second device call: PDL + prefetch (A/B), warm-up, profile, access patterns, v2 crossover.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s3b; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-12} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s3b; return $rc; }
D="python3 benchmarks/decode_speed.py --contexts 1024 --steps 32"
TAILN=15 step gpu_tests 170 python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider
step decode 120 $D --models gpt-oss-120b,gpt-oss-20b --batch-sizes 1 --json $R/decode.json || step decode_nowarm 100 $D --models gpt-oss-120b,gpt-oss-20b --batch-sizes 1 --no-warmup --json $R/decode.json
step decode_pdl_off 60 $D --models gpt-oss-120b --batch-sizes 1 --no-warmup --pdl off --json $R/decode_pdl_off.json
step decode_pf0 60 $D --models gpt-oss-120b --batch-sizes 1 --no-warmup --gemv-prefetch 0 --json $R/decode_pf0.json
step decode_pf4 60 $D --models gpt-oss-120b --batch-sizes 1 --no-warmup --gemv-prefetch 4 --json $R/decode_pf4.json
step profile 90 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --top 14 --json $R/profile.json
step access 40 python3 benchmarks/access_pattern.py --json $R/access.json
step crossover 60 $D --models gpt-oss-120b --batch-sizes 8,16,32 --no-warmup --json $R/cross_default.json
step crossover_v2 60 $D --models gpt-oss-120b --batch-sizes 8,16,32 --no-warmup --moe-max-pairs 16 --json $R/cross_v2.json
