#!/usr/bin/env bash
# Session 11, call 1 (commit: the one that adds this file): #7's batch-8 loss. The guard's books
# against the wall clock on gpt-oss-mini (guard_accounting.py, now with each request's finish
# time: a closed batch lasts as long as its slowest request), with the shared trie's background
# work on (default) and off; test_guard's GPU test both ways; then the speculation GPU tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s11c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s11c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
GA="benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 1,8"
TAILN=60 step ga1024_bg 300 python3 $GA --max-tokens 1024 --json $R/ga1024_bg.json
TAILN=30 step ga1024_nobg 120 env GOSSAMER_SPEC_BACKGROUND=0 python3 $GA --max-tokens 1024 --json $R/ga1024_nobg.json
TAILN=30 step ga256_bg 90 python3 $GA --max-tokens 256 --json $R/ga256_bg.json
for round in 1 2; do
  TAILN=4 step guard_test_bg_$round 60 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=line
  TAILN=4 step guard_test_nobg_$round 60 env GOSSAMER_SPEC_BACKGROUND=0 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=line
done
TAILN=12 step gpu_tests 240 python3 -m pytest -m gpu tests/spec tests/engine/test_async_scheduling_gpu.py --deselect tests/spec/test_guard.py::test_gpu_mini_guarded_auto_does_not_lose_at_batch_8 -p no:cacheprovider -q --tb=short -rf --durations=15
