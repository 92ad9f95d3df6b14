#!/usr/bin/env bash
# Session 16, call 3 (the timeline steps failed: steps cut by event count did not line up; call 4 reruns them). #8: where the fed batch-1 step's time goes inside the CUDA graph, kernel by
# kernel (graph_timeline.py: CUPTI's view of the replays, end deltas), for 20b and 120b; then the
# 20b QKV GEMV unsplit with 8 tiles in flight against the defaults, 5 rounds (session 14: -5 us at
# 3 rounds, within noise).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s16c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s16c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=45 step timeline_20b 170 python3 benchmarks/graph_timeline.py --model gpt-oss-20b --json $R/timeline_20b.json
TAILN=45 step timeline_120b 200 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --json $R/timeline_120b.json
TAILN=6 step ab_20b 120 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_whole_k_s8 --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b.json
