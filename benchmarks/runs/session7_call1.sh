#!/usr/bin/env bash
# Session 7, call 1: why the expert-grouped GEMV breaks tests/kernels/test_triton_model.py
# (benchmarks/grouped_gemv_diag.py with PDL on and off, and the model test with PDL off), then
# batch-1 decode with tokens fed on the device (decode_speed.py's new `fed` rows) and a fresh
# per-kernel profile of the 120b batch-1 step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s7c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s7c1; return $rc; }
GG="GOSSAMER_GROUPED_GEMV_MAX_PAIRS=128 GOSSAMER_DECODE_MAX_PAIRS=32"
TAILN=40 step diag_pdl 90 env $GG python3 benchmarks/grouped_gemv_diag.py
TAILN=40 step diag_nopdl 60 env $GG GOSSAMER_PDL=0 python3 benchmarks/grouped_gemv_diag.py
TAILN=6 step model_gg_nopdl 60 env $GG GOSSAMER_PDL=0 python3 -m pytest -m gpu tests/kernels/test_triton_model.py -k greedy -p no:cacheprovider -q --tb=line
TAILN=12 step decode_b1 150 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
TAILN=45 step profile_120b 150 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --top 40 --json $R/profile_120b.json
