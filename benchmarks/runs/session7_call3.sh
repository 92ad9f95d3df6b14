#!/usr/bin/env bash
# Session 7, call 3: GPU tests of the new defaults (expert-grouped GEMV on again, down GEMV loads a
# step ahead, decode attention skips splits past its keys, speculation idle -> overlapped steps),
# then decode speed at batch 1/16/32 (both models, host-loop and device-fed rows), the 120b engine
# at one request, and speculation on gpt-oss-mini with overlapped scheduling (the serve default).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s7c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s7c3; return $rc; }
TAILN=8 step gpu_tests 140 python3 -m pytest -m gpu tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py tests/kernels/test_triton_model.py tests/kernels/test_moe_grouped_gemv.py tests/spec/test_idle_overlap.py -p no:cacheprovider -q --tb=short
TAILN=16 step decode 160 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1,16,32 --steps 32 --json $R/decode.json
TAILN=24 step spec_e2e 130 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-guard --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
