#!/usr/bin/env bash
# Session 9, call 2 (commit: the one that adds this file): speculation on mini in longer runs
# (1024 tokens, three timed runs each) with the measured guard, where a guarded run's time goes
# (guard_accounting.py on the real model), the guard's and the MoE AHEAD removal's GPU tests, and
# decode attention's key-tile prefetch at 1k context (with 64- and 128-key splits).
# NOTE: fusion_ab.py's prefetch variants were renamed when the prefetch became the default
# (prefetch_next -> the defaults, no_prefetch; prefetch_next_128 -> split_128): to re-run this call
# as it ran, check out the commit it names.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s9c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s9c2; return $rc; }
TAILN=16 step spec_e2e 230 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-noguard --batch-sizes 1,8 --max-tokens 1024 --runs 3 --json $R/spec_e2e.json
TAILN=40 step guard_accounting 100 python3 benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 1,8 --max-tokens 1024 --json $R/guard_accounting.json
TAILN=8 step gpu_tests 80 python3 -m pytest -m gpu tests/spec/test_guard.py tests/kernels/test_moe_mxfp4.py -k "guard or ahead or 120b" -p no:cacheprovider -q --tb=short -rf
TAILN=6 step ab_attn_1k 170 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,prefetch_next,prefetch_next_128 --interleave --fed --rounds 3 --steps 32 --json $R/ab_attn_1k.json
