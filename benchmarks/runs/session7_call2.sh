#!/usr/bin/env bash
# Session 7, call 2: the batch-1 MoE GEMVs loading a step ahead (AHEAD 1: scales, 2: and x words):
# GPU bit-equality tests, the T=1 MoE layer A/B, the whole 120b step A/B (interleaved, tokens fed
# on the device); then each bf16 backend's error per position along the greedy continuation of
# test_triton_model's prompt, grouped GEMV off (defaults) and on. Also the GPU attention tests
# (splits past a tile's keys now exit without partials or an arrival).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s7c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s7c2; return $rc; }
GG="GOSSAMER_GROUPED_GEMV_MAX_PAIRS=128 GOSSAMER_DECODE_MAX_PAIRS=32"
TAILN=4 step ahead_tests 90 python3 -m pytest -m gpu tests/kernels/test_moe_mxfp4.py -k "ahead or 120b_matches or repacked" -p no:cacheprovider -q --tb=short
TAILN=4 step attention_tests 120 python3 -m pytest -m gpu tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py -p no:cacheprovider -q --tb=short
TAILN=12 step ahead_layer 90 python3 benchmarks/moe_decode_sweep.py --ahead 5 --json $R/ahead_layer.json
TAILN=8 step ahead_120b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,ahead1,ahead2 --interleave --fed --rounds 8 --steps 32 --json $R/ahead_120b.json
TAILN=20 step drift_default 60 python3 benchmarks/grouped_gemv_diag.py --drift 64
TAILN=20 step drift_gg 60 env $GG python3 benchmarks/grouped_gemv_diag.py --drift 64
