#!/usr/bin/env bash
# Session 22, call 3: the batch-64 step's small launches, changed after call 2 (one attention
# split when the sequences alone give ~4 programs an SM; the expert schedule's sort placement;
# v2's one-launch slot sum).
# 1. decode_speed.py at batch 64, 1k: new defaults (A) against the old three (B:
#    GOSSAMER_ATTN_SPLITS_UP=1 GOSSAMER_SCHEDULE_SORT_MAX=0 GOSSAMER_V2_SLOT_SUM=0), A B A.
# 2. throughput.py at C=64 (the bar's command; --kv-cache-gib 10 on an H100).
# 3. GPU tests of the changed kernels (attention, the schedule and slot sum, v2, the context
#    graphs, the triton model's logits against the reference), in what time is left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s22c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s22c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
OLD="GOSSAMER_ATTN_SPLITS_UP=1 GOSSAMER_SCHEDULE_SORT_MAX=0 GOSSAMER_V2_SLOT_SUM=0"
B64="benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 64 --steps 32"
TAILN=3 step b64_new_1 120 python3 $B64 --json $R/b64_new_1.json
TAILN=3 step b64_old_1 120 env $OLD python3 $B64 --json $R/b64_old_1.json
TAILN=3 step b64_new_2 120 python3 $B64 --json $R/b64_new_2.json
KV=""; grep -q H200 $R/gpu.txt || KV="--kv-cache-gib 10"
TAILN=4 step tp120_c64 300 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 $KV --json $R/tp120_c64.json
TAILN=8 step gpu_tests 200 bash benchmarks/gpu_tests.sh tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py tests/kernels/test_moe_grouped_gemv.py tests/kernels/test_moe_mxfp4.py tests/runner/test_context_graphs_gpu.py tests/kernels/test_triton_model.py
