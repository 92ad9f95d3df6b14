#!/usr/bin/env bash
# Prepared in session 16 for the next session (not run yet: session 16's device time ended when no
# machine was lent). #8, ~8 min:
# (1) graph_timeline.py, 20b and 120b: the fed batch-1 step inside its CUDA graph, kernel by kernel
#     (end deltas: what each kernel adds to the chain under PDL), the per-kernel table #8 asks for;
# (2) 20b: the QKV GEMV unsplit is the default now (tall_m1, measured -6.6 us on 20b in session 16
#     call 3); its pipeline depth, O in 1-3 splits, and the input norm folded into the unsplit
#     QKV's prologue (320 programs; the fold lost against ~1,000 split ones in session 3);
# (3) 120b: the unsplit QKV against the split one (the same QKV shape as 20b; not measured there).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s17c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s17c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=34 step timeline_20b 150 python3 benchmarks/graph_timeline.py --model gpt-oss-20b --json $R/timeline_20b.json
TAILN=34 step timeline_120b 150 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --json $R/timeline_120b.json
TAILN=12 step ab_20b 150 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_split,qkv_whole_k_s6,qkv_whole_k_s12,o_whole_k_s8,o_split2_s8,o_split3_s6,norm_folded,norm_folded_early --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b.json
TAILN=6 step ab_120b 120 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,qkv_split --interleave --fed --rounds 5 --steps 32 --json $R/ab_120b.json
