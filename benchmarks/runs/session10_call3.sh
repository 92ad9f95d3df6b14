#!/usr/bin/env bash
# Session 10, call 3 (commit: the one that adds this file): the suffix proposer's shared index
# taken in while the engine waits for the GPU and at most 64 tokens per proposal (was an eighth
# of the backlog: ~5 ms proposals after a batch finished, call 2's profile), outputs evicted
# before they were taken in dropped. Speculation on mini, interleaved, and its batch-8 profile;
# call 2's failed GPU test (test_calibrate, output cut) alone, then the other speculation GPU tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s10c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s10c3; return $rc; }
TAILN=12 step spec_e2e 200 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
TAILN=6 step spec_profile 40 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 8 --max-tokens 512 --runs 1 --interleave --profile --json $R/spec_profile.json
TAILN=25 step calibrate_test 60 python3 -m pytest -m gpu tests/spec/test_calibrate.py -p no:cacheprovider -q --tb=short -rf
TAILN=8 step gpu_tests 100 python3 -m pytest -m gpu tests/spec tests/engine/test_async_scheduling_gpu.py --deselect tests/spec/test_calibrate.py::test_gpu_mini_times_its_verification_steps -p no:cacheprovider -q --tb=line -rf
