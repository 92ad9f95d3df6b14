#!/usr/bin/env bash
# Session 3 third device call: GPU tests after the PDL fix, MoE + GEMV sweeps with longer row runs,
# the decode table with the swept configs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s3c; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s3c; return $rc; }
TAILN=8 step gpu_tests 230 python3 -m pytest tests/kernels tests/spec -m gpu -q -p no:cacheprovider
TAILN=6 step moe_sweep 60 python3 benchmarks/moe_decode_sweep.py --json $R/moe_sweep.json
TAILN=4 step gemv_sweep 150 python3 benchmarks/gemv_sweep.py --out $R/gemv_sweep.json
T=""; [ -s $R/moe_sweep.json ] && T="$T --moe-sweep $R/moe_sweep.json"; [ -s $R/gemv_sweep.json ] && T="$T --gemv-sweep $R/gemv_sweep.json"
TAILN=20 step decode 140 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1,16,32,64,256 --steps 32 --no-warmup $T --json $R/decode.json
TAILN=4 step merge_separate 50 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 32 --no-warmup $T --attention-merge separate --json $R/decode_merge_separate.json
