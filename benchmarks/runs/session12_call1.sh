#!/usr/bin/env bash
# Prepared by session 11 for the next session's first call (NOTES.md, "eleventh session's view");
# not yet run. #7: the stricter guard GPU test (three rounds of new batches; 0.82-0.84x before
# f8c45bc) and the guard's books over six rounds; #8: the first Nsight Compute counters, the v2
# MoE at 64 tokens on 120b and the first 80 kernels of a 20b batch-1 step. Each step has its own
# time limit; a failing step does not stop the others.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=3 step ncu_version 20 ncu --version
TAILN=6 step guard_test 200 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=short
TAILN=20 step ga_rounds 120 python3 benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 8 --max-tokens 256 --rounds 6 --json $R/ga_rounds.json
TAILN=12 step ncu_120b_b64 150 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R -k regex:_v2_
TAILN=40 step ncu_20b_b1 100 bash benchmarks/ncu_step.sh gpt-oss-20b 1 $R -c 80
