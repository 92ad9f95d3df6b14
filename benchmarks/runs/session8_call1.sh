#!/usr/bin/env bash
# Session 8, call 1: the GPU tests (the kernel tests' harness fix from session 7 and the attention
# changes since: empty splits skipped, one-split tiles finished in place), the decode attention's
# keys-per-split sweep (launches sized for 131k like the engine's graphs), the whole 120b batch-1
# step with the sweep's best minimum against the default (separate processes), and the down GEMV's
# AHEAD/rows sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s8c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s8c1; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
TAILN=12 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels tests/spec/test_idle_overlap.py -p no:cacheprovider -q --tb=short -rf
TAILN=30 step attn_splits 110 env OUT=$R python3 benchmarks/kernels_attention.py --min-split-keys 64,128,256,1024 --graph-max-len 131072
BEST=$(python3 - <<'PY'
import json
rows = json.load(open("/tmp/s8c1/kernels_attention_splits.json"))["rows"]
total = {}
for r in rows:
    if r["batch"] == 1 and r["context"] == 1024:
        total[r["min_split_keys"]] = total.get(r["min_split_keys"], 0.0) + r["us"]
print(min(total, key=total.get))
PY
)
echo "best batch-1 1k min_split_keys: $BEST"
TAILN=24 step down_sweep 120 python3 benchmarks/moe_decode_sweep.py --ahead 2 --down-ahead --json $R/down_sweep.json
TAILN=10 step decode_default 100 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 64 --json $R/decode_default.json
GOSSAMER_ATTN_MIN_SPLIT_KEYS=$BEST TAILN=10 step decode_best 100 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 64 --json $R/decode_best.json
