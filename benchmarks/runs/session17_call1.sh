#!/usr/bin/env bash
# Prepared in session 16 for the next session (not run yet: session 16's device time ended when no
# machine was lent). #8, ~9 min. The unembedding at batch 1 on the Triton GEMV (gemv.TRITON_UNEMBED,
# off): in the 20b graph cuBLAS's unembedding costs 279 us where a streaming kernel reads the same
# 1.16 GB in 255 us (chain_floor.py), and its float32 logits need a cast kernel after it. The
# Triton path runs under PDL and stores float32 logits (bf16 values) itself. 20b needs -26 us for
# 700 tok/s (1.455 ms now, with the unsplit QKV of session 16 call 3).
# (1) GPU tests: gemv (the unembedding logits test is new; the unsplit QKV is the default now) and
#     the route-in-experts bits test with the packed-key top-k (moe_mxfp4.TOP_K_KEYS, new, off);
# (2) 20b: defaults against the Triton unembedding on six tiles, interleaved, fed, 5 rounds;
# (3) 120b: defaults, the split QKV (the unsplit one was only measured on 20b), the Triton
#     unembedding on huge_m1's tile, the packed-key top-k in the routing kernel, and the expert
#     GEMVs routing themselves at 128 experts with either top-k (+46 us in session 15 with the
#     two-reduction one; the keys halve its reductions and barriers in SASS).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s17c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s17c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=8 step gpu_tests 150 python3 -m pytest -m gpu tests/kernels/test_gemv.py tests/kernels/test_route_in_experts.py -p no:cacheprovider -q --tb=short -rf
TAILN=12 step ab_20b_unembed 170 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,unembed_triton,unembed_64x64w4s4,unembed_16x64w1s8,unembed_64x128w8s4,unembed_32x256w4s3,unembed_16x256w2s4 --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b_unembed.json
TAILN=10 step ab_120b 220 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,qkv_split,unembed_triton,topk_keys,route_in_all,route_in_all_keys --interleave --fed --rounds 5 --steps 32 --json $R/ab_120b.json
