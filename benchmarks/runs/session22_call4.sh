#!/usr/bin/env bash
# Session 22, call 4: v2's prefill-sized M-tiles (64 and 128 rows, GOSSAMER_V2_MAX_BLOCK_M=128),
# then GPU tests of this session's kernel changes (call 3's run was cut at its time limit).
# 1. moe_grouped_sweep.py --block-ms 32,64,128: one 120b MoE layer at 1024 and 8192 tokens.
# 2. decode_speed.py batch 1 (its TTFT row: a 1k-token prefill), cap 128 (A) against 32 (B), A B A.
# 3. throughput.py at C=64 with the cap at 128 (call 3 on an H100 with 32: 2,152.4 tok/s).
# 4. GPU tests: v2 (with the tall tiles), the schedule, context graphs, the triton model.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s22c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s22c4; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step sweep_tall 150 python3 benchmarks/moe_grouped_sweep.py --block-ms 32,64,128 --warps 8 --tokens 1024 --confirm 8192 --json $R/sweep_tall.json
B1="benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 8"
TAILN=2 step ttft_128_1 90 env GOSSAMER_V2_MAX_BLOCK_M=128 python3 $B1 --json $R/ttft_128_1.json
TAILN=2 step ttft_32_1 90 python3 $B1 --json $R/ttft_32_1.json
TAILN=2 step ttft_128_2 90 env GOSSAMER_V2_MAX_BLOCK_M=128 python3 $B1 --json $R/ttft_128_2.json
KV=""; grep -q H200 $R/gpu.txt || KV="--kv-cache-gib 10"
TAILN=3 step tp120_c64_128 200 env GOSSAMER_V2_MAX_BLOCK_M=128 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 $KV --json $R/tp120_c64_128.json
TAILN=8 step gpu_tests 240 bash benchmarks/gpu_tests.sh tests/kernels/test_moe_mxfp4.py tests/kernels/test_moe_grouped_gemv.py tests/runner/test_context_graphs_gpu.py tests/kernels/test_triton_model.py
# After this call the GOSSAMER_V2_MAX_BLOCK_M switch was removed: the 64- and 128-row tiles were
# wrong on the GPU (sweep_tall: ok=False), so the ttft_128 and tp120_c64_128 numbers are not
# results of a correct configuration.
