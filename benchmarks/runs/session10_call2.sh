#!/usr/bin/env bash
# Session 10, call 2 (commit: the one that adds this file): the host cost of a step's upload (one
# copy against per-input copies, one process); speculation on mini with the one-copy uploads and
# the speculator's O(1) idle steps (a41b9e5), engines built first and runs interleaved, and its
# host profile at batch 8; the engine at one request for 120b and 20b; the speculation GPU tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s10c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s10c2; return $rc; }
TAILN=4 step upload_cost 60 python3 benchmarks/upload_cost.py --batch-sizes 1,8,64 --json $R/upload_cost.json
TAILN=12 step spec_e2e 240 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 1,8 --max-tokens 1024 --runs 3 --interleave --json $R/spec_e2e.json
TAILN=4 step spec_profile 80 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto --batch-sizes 8 --max-tokens 512 --runs 1 --interleave --profile --json $R/spec_profile.json
TP="python3 benchmarks/throughput.py --input-len 1024"
TAILN=3 step tp120_c1 110 $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_c1.json
TAILN=3 step tp20_c1 60 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --json $R/tp20_c1.json
TAILN=8 step gpu_tests 120 python3 -m pytest -m gpu tests/spec tests/engine/test_async_scheduling_gpu.py -p no:cacheprovider -q --tb=short -rf
