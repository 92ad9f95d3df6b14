#!/usr/bin/env bash
# Session 12, call 3. #7 after the idle-tick fast path (speculator._idle_tick): the guard GPU test
# (eight rounds, engines in turn A B / B A) and the guard's books over eight interleaved rounds on
# mini at batch 8; the GPU tests of the overlapped engine and of speculation.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step guard_test 200 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=short
TAILN=3 step ga_rounds 100 python3 benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 8 --max-tokens 256 --rounds 8 --json $R/ga_rounds.json
TAILN=4 step spec_gpu 190 python3 -m pytest -m gpu tests/spec/test_idle_overlap.py tests/engine/test_async_scheduling_gpu.py tests/spec/test_spec_gpu.py -p no:cacheprovider -q --tb=short
