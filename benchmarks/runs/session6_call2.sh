#!/usr/bin/env bash
# Session 6, call 2: interleaved A/B of the L2 prefetch and the router-only norm fold (120b, 20b,
# batch 1); overlapped scheduling with pinned uploads (20b, C=1); auto speculation with the
# measured guard and EAGLE-3 chain/tree on mini; decode at batch 8-64 with the grouped GEMV on.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s6c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s6c2; return $rc; }
TAILN=6 step ab_120b 130 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants no_prefetch,l2_prefetch,router_norm_folded --interleave --rounds 12 --steps 16 --json $R/ab_120b.json
TAILN=8 step tp_sync 70 python3 benchmarks/throughput.py --models gpt-oss-20b --concurrency 1 --input-len 1024 --output-len 256 --json $R/tp_20b_sync.json
TAILN=8 step tp_async 70 python3 benchmarks/throughput.py --models gpt-oss-20b --concurrency 1 --input-len 1024 --output-len 256 --async-scheduling --json $R/tp_20b_async.json
TAILN=16 step spec_auto 90 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-noguard --batch-sizes 1,8 --max-tokens 256 --json $R/spec_auto.json
TAILN=16 step spec_eagle3 110 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --eagle3 ../out/eagle3-mini/head --tree --methods none,eagle3,eagle3-tree --batch-sizes 1,8 --max-tokens 256 --json $R/spec_eagle3.json
TAILN=12 step decode_grouped 110 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 8,16,32,64 --steps 24 --json $R/decode_grouped.json
