#!/usr/bin/env bash
# Session 22, call 2: the batch-64 step's small launches and its attention (call 1's profile on an
# H100: attention 45.7 us a layer against a ~3 us byte floor, the expert schedule 11.7 us, v2's
# torch slot sum 5.3 + 1.5 us).
# 1. moe_schedule_sweep.py: the schedule's one-hot placement (CHUNK x warps) and sort placement,
#    the slot sum (torch against slot_sum), at 4..1024 pairs.
# 2. kernels_attention.py --sweep-batch: decode attention at batch 64, 1k and 2k keys, full and
#    sliding layers, over splits x keys an iteration x warps.
# 3. step_profile.py at batch 64 with v2's slot sum (now the default) and the sort schedule on.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s22c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s22c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=40 step schedule 120 python3 benchmarks/moe_schedule_sweep.py --json $R/schedule.json
TAILN=90 step attn_b64 260 python3 benchmarks/kernels_attention.py --sweep-batch --batch-sizes 64 --contexts 1024,2048 --num-splits auto,1,2,4,8 --block-n 32,64 --warps 4,8
cp $OUT/kernels_attention_batch.json $R/ 2>/dev/null
TAILN=30 GOSSAMER_SCHEDULE_SORT_MAX=4096 step profile120_b64 200 env GOSSAMER_SCHEDULE_SORT_MAX=4096 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 24 --json $R/profile120_b64.json
