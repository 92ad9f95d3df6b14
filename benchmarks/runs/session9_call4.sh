#!/usr/bin/env bash
# Session 9, call 4 (commit: the one that adds this file): the engine with this session's defaults
# (decode attention's key-tile prefetch on): 120b and 20b at one request, 120b at concurrency 64,
# 1k-token prompts (throughput.py: 131k-context graphs, overlapped scheduling).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s9c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s9c4; return $rc; }
TP="python3 benchmarks/throughput.py --input-len 1024"
TAILN=3 step tp120_c1 110 $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_c1.json
TAILN=3 step tp20_c1 60 $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --json $R/tp20_c1.json
TAILN=3 step tp120_c64 150 $TP --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
