#!/usr/bin/env bash
# Session 15, call 3. #8 with this session's defaults (packed QKV / O on; the decode MoE routes in
# its GEMVs up to 32 experts, i.e. on 20b): GPU tests of the kernels and runner; batch-1
# decode_speed at 1k and 8k (the record); fusion_ab of the two switches against the new defaults;
# chain_floor with the experts read in the MoE GEMVs' tiles (all_experts_tiled).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s15c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s15c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=8 step gpu_tests 260 python3 -m pytest -m gpu tests/kernels/test_gemv.py tests/kernels/test_norm_linear.py tests/kernels/test_route_in_experts.py tests/kernels/test_triton_model.py tests/kernels/test_triton_ops.py tests/kernels/test_norm.py tests/kernels/test_router_moe.py tests/kernels/test_moe_mxfp4.py tests/runner -p no:cacheprovider -q --tb=short -rf
TAILN=12 step decode_speed 130 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_speed.json
TAILN=8 step ab_20b 90 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,routing_kernel,no_packed --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=40 step chain_floor 60 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json
