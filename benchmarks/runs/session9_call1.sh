#!/usr/bin/env bash
# Session 9, call 1: the late RMSNorm fold (gemv.LATE_NORM_MAX_M: two launches fewer per layer)
# A/B on both models at batch 1 (interleaved, tokens fed on the device), its GPU tests (kernels,
# and the whole model's logits and 64 greedy steps with it on), the measured guard's GPU test, and
# the untimed key-tile prefetch of decode attention (attention.PREFETCH_NEXT_KV) at 8k context.
# NOTE: fusion_ab.py's prefetch variants were renamed when the prefetch became the default
# (prefetch_next -> the defaults, no_prefetch; prefetch_next_128 -> split_128): to re-run this call
# as it ran, check out the commit it names.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s9c1; mkdir -p $R
# Ran on 95aabba (the late norm fold d2832b5, reverted after this call in 4888321).
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s9c1; return $rc; }
TAILN=6 step ab_120b 210 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,late_norm --interleave --fed --rounds 4 --steps 32 --json $R/ab_120b.json
TAILN=6 step ab_20b 100 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,late_norm --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=12 step gpu_tests 130 env GOSSAMER_LATE_NORM=1 python3 -m pytest -m gpu tests/kernels/test_late_norm.py tests/kernels/test_triton_model.py tests/spec/test_guard.py -p no:cacheprovider -q --tb=short -rf
TAILN=6 step ab_8k 120 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,prefetch_next --interleave --fed --rounds 3 --steps 32 --context 8192 --json $R/ab_8k.json
