#!/usr/bin/env bash
# Session 14, call 2. #8: first weights before the PDL wait. MoE gate_up finds its expert from
# the router logits (written two launches back, final by then) with the routing's own top-k and
# loads its first step's words before its wait (DECODE_FP16_GATE_UP's EARLY); the dense
# tensor-core GEMV loads its first W tile before its wait (GemvConfig.early). GPU tests of both,
# then the batch-1 step in the graph, 20b and 120b, interleaved and fed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s14c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels/test_moe_mxfp4.py tests/kernels/test_gemv.py tests/kernels/test_norm_linear.py -p no:cacheprovider -q --tb=short
TAILN=10 step ab_20b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,gate_up_early,qkv_early,o_early,dense_early,all_early --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=8 step ab_120b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,gate_up_early,dense_early,all_early --interleave --fed --rounds 4 --steps 32 --json $R/ab_120b.json
