#!/usr/bin/env bash
# Session 6, call 3: GPU tests of the defaults after the prefetch code came out and overlapped
# scheduling became the default, then synchronous vs overlapped steps in turn (20b C=1 twice,
# 120b C=1, 20b C=64).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s6c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s6c3; return $rc; }
TP="python3 benchmarks/throughput.py --input-len 1024"
TAILN=8 step gpu_tests 110 python3 -m pytest -m gpu tests/engine/test_async_scheduling_gpu.py tests/runner/test_pinned_uploads_gpu.py tests/kernels/test_triton_model.py -p no:cacheprovider -q --tb=short
TAILN=3 step tp20_sync_a 80 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --no-async-scheduling --json $R/tp20_sync_a.json
TAILN=3 step tp20_async_a 40 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --json $R/tp20_async_a.json
TAILN=3 step tp20_sync_b 40 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --no-async-scheduling --json $R/tp20_sync_b.json
TAILN=3 step tp20_async_b 40 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --json $R/tp20_async_b.json
TAILN=3 step tp120_async 80 $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_async.json
TAILN=3 step tp120_sync 70 $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --no-async-scheduling --json $R/tp120_sync.json
TAILN=3 step tp20_c64_async 45 $TP --models gpt-oss-20b --concurrency 64 --output-len 256 --json $R/tp20_c64_async.json
TAILN=3 step tp20_c64_sync 45 $TP --models gpt-oss-20b --concurrency 64 --output-len 256 --no-async-scheduling --json $R/tp20_c64_sync.json
