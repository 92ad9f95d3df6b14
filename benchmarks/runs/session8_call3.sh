#!/usr/bin/env bash
# Session 8, call 3 (right after call 2, on the warm machine): the engine with its 131k-context
# graphs at one request (throughput.py C=1; 120b three runs: the merge unrolled over all 64 splits,
# over the used ones only (GOSSAMER_ATTN_MERGE_UNROLL=512), unrolled again), the attention kernel
# at 131k launches with the looped merge, 20b at C=1, 120b at C=64 (the 4,000 tok/s bar).
# CHOICE (env assignments) carries call 2's A/B winners, e.g.
#   CHOICE="GOSSAMER_ROUTE_IN_GEMV=1 GOSSAMER_ATTN_EARLY_KV=1" bash benchmarks/runs/session8_call3.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s8c3; mkdir -p $R
CHOICE=${CHOICE:-GOSSAMER_ROUTE_IN_GEMV=0}
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s8c3; return $rc; }
TP="python3 benchmarks/throughput.py --input-len 1024"
echo "choice: $CHOICE"
TAILN=3 step tp120_c1_a 90 env $CHOICE $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_c1_a.json
TAILN=3 step tp120_c1_loop 75 env $CHOICE GOSSAMER_ATTN_MERGE_UNROLL=512 $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_c1_loop.json
TAILN=3 step tp120_c1_b 75 env $CHOICE $TP --models gpt-oss-120b --concurrency 1 --output-len 512 --json $R/tp120_c1_b.json
TAILN=12 step attn_loop 50 env OUT=$R GOSSAMER_ATTN_MERGE_UNROLL=512 python3 benchmarks/kernels_attention.py --min-split-keys 64 --graph-max-len 131072
TAILN=3 step tp20_c1 50 env $CHOICE $TP --models gpt-oss-20b --concurrency 1 --output-len 512 --json $R/tp20_c1.json
TAILN=3 step tp120_c64 150 env $CHOICE $TP --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
