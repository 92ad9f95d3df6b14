#!/usr/bin/env bash
# Session 5, call 1: the fused norm + router + routing launch on the GPU (tests, then an A/B on
# one machine for 120b and 20b at batch 1), and overlapped scheduling against synchronous steps.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s5c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s5c1; return $rc; }
TAILN=6 step router_tests 100 python3 -m pytest tests/kernels/test_router_moe.py -p no:cacheprovider -q --tb=line
TAILN=14 step fusion_ab 300 python3 benchmarks/fusion_ab.py --models gpt-oss-120b,gpt-oss-20b --variants defaults,no_router,router_split --rounds 2 --steps 64 --json $R/fusion_ab.json
TAILN=8 step tp_sync 80 python3 benchmarks/throughput.py --models gpt-oss-20b --concurrency 1 --input-len 1024 --output-len 512 --json $R/tp_20b_sync.json
TAILN=8 step tp_async 80 python3 benchmarks/throughput.py --models gpt-oss-20b --concurrency 1 --input-len 1024 --output-len 512 --async-scheduling --json $R/tp_20b_async.json
