#!/usr/bin/env bash
# Session 15, call 2. #8, 20b batch 1: (1) GPU tests of the decode MoE without its routing kernel
# (moe_mxfp4.ROUTE_IN_EXPERTS, on: the norm writes the experts' fp16 input, gate_up and down route
# from the logits), the kernels it touches and the whole-model tests; (2) fusion_ab in the graph:
# the defaults against the routing kernel, packed QKV / O, and the batch-1 gate_up / down / norm
# launch configs (20b, then 120b's three); (3) decode_speed batch 1 at 1k and 8k.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s15c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s15c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=8 step gpu_tests 170 python3 -m pytest -m gpu tests/kernels/test_route_in_experts.py tests/kernels/test_norm.py tests/kernels/test_router_moe.py tests/kernels/test_triton_model.py tests/kernels/test_triton_ops.py -p no:cacheprovider -q --tb=short -rf
V20=defaults,routing_kernel,packed,gu_p8w2,gu_p8w4,gu_p16w2,gu_p32w8,gu_g8,gu_g32,gu_s3,dn_r2w1,dn_r2w2,dn_w2,dn_r4w4,dn_g8,dn_g32,norm_w2,norm_w4,norm_w16
TAILN=24 step ab_20b 210 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants $V20 --interleave --fed --rounds 3 --steps 32 --json $R/ab_20b.json
TAILN=8 step ab_120b 120 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,routing_kernel,packed --interleave --fed --rounds 5 --steps 32 --json $R/ab_120b.json
TAILN=12 step decode_speed 100 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_speed.json
