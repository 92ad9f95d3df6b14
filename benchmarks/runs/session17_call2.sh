#!/usr/bin/env bash
# Prepared in session 16 for the next session; session 17 ran it after call 1 had made the Triton
# unembedding and the packed-key top-k the defaults. #8, ~7 min:
# (1) graph_timeline.py, 20b and 120b: the fed batch-1 step inside its CUDA graph, kernel by kernel
#     (end deltas: what each kernel adds to the chain under PDL; the idle time between replays),
#     the per-kernel table #8 asks for, with this session's defaults;
# (2) 20b: the unsplit QKV's pipeline depth, O in 1-3 splits, and the input norm folded into the
#     unsplit QKV's prologue (320 programs; the fold lost against ~1,000 split ones in session 3),
#     and the two-reduction top-k in gate_up / down (20b routes in the experts; 32 experts: one
#     warp; the packed keys were only measured on 120b when they became the default).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s17c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s17c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=34 step timeline_20b 150 python3 benchmarks/graph_timeline.py --model gpt-oss-20b --json $R/timeline_20b.json
TAILN=34 step timeline_120b 150 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --json $R/timeline_120b.json
TAILN=12 step ab_20b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_whole_k_s6,qkv_whole_k_s12,o_whole_k_s8,o_split2_s8,o_split3_s6,norm_folded,norm_folded_early,topk_two_reductions --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b.json
