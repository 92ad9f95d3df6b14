#!/usr/bin/env bash
# Session 13, call 2. #8: (a) v2's M-tile height and warps over the batch sizes past the GEMVs
# (8, 16, 32 rows on 4 or 8 warps at 64-1024 tokens, one 120b layer); (b) 120b at concurrency 64
# with v2's 8-row tiles on 4 warps (GOSSAMER_V2_MIN_BLOCK_M=8, an A/B switch of this session's code
# then, since replaced by moe_mxfp4._v2_block_m; the default was 2,164-2,191 tok/s in
# sessions 8-9); (c) 20b batch 1 in its graph: the QKV, O and router GEMVs on other tiles, and the
# MoE knock-outs that split routing / gate_up / down (timing only).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s13c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s13c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=32 step v2_tiles 150 python3 benchmarks/moe_grouped_sweep.py --block-ms 8,16,32 --warps 4,8 --tokens 64 --confirm 128,256,512,1024 --json $R/v2_tiles.json
TAILN=12 step gemv_20b 240 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,qkv_dot,qkv_dot_k128,qkv_dot_s8,o_whole_n1,o_dot_k128,o_dot_s8,router_whole_n1,ko_expert_gemvs,ko_down,ko_experts --interleave --fed --rounds 3 --steps 32 --json $R/gemv_20b.json
TAILN=3 GOSSAMER_V2_MIN_BLOCK_M=8 step tp120_c64_bm8 170 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64_bm8.json
