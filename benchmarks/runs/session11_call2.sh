#!/usr/bin/env bash
# Session 11, call 2 (commit: the one that adds this file): #7 after call 1's findings. The
# speculator's deferred work fills only waits that have lately averaged 100 us (HostSlack: call
# 1's plain steps of auto took 0.362 ms against none's 0.322 with it at every wait), and the
# guard decides on each mode's windows merged with their history (HISTORY_WEIGHT: call 1's
# guard kept speculating at batch 8 on a window that read 0.215 ms a token where the run's
# speculating steps averaged 0.382). Speculation on mini interleaved, the guard's books, and
# test_guard's GPU test three times.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s11c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s11c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step spec_e2e 260 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
TAILN=34 step ga1024 100 python3 benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 1,8 --max-tokens 1024 --json $R/ga1024.json
for round in 1 2 3; do
  TAILN=4 step guard_test_$round 40 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=line
done
