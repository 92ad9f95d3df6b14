#!/usr/bin/env bash
# Session 8, call 2: GPU tests of this session's kernels (decode attention: first key tile before
# the PDL wait, one-split tiles finished in place; the routing folded into the MoE GEMVs), the
# whole 120b batch-1 step A/B of both (interleaved, tokens fed on the device), decode speed of both
# models with the A/B's winners, speculation on mini with the reworked measured guard.
# NOTE: the route_in_gemv variants left with the revert 6ef53f0; to re-run this call as it ran, check
# out 576306a.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s8c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s8c2; return $rc; }
TAILN=12 step gpu_tests 150 python3 -m pytest -m gpu tests/kernels/test_attention_rope_fused.py tests/kernels/test_route_in_gemv.py tests/kernels/test_triton_model.py tests/kernels/test_attention.py tests/kernels/test_norm.py tests/kernels/test_router_moe.py tests/spec/test_idle_overlap.py tests/kernels/test_moe_mxfp4.py -p no:cacheprovider -q --tb=short -rf
TAILN=10 step fusion_ab 190 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,late_kv,route_in_gemv,route_late_kv --interleave --fed --rounds 4 --steps 32 --json $R/fusion_ab.json
CHOICE=$(python3 - <<'PY'
import json
try:
    rows = {r["variant"]: r["ms"] for r in json.load(open("/tmp/s8c2/fusion_ab.json"))["rows"]}
except Exception:
    rows = {}
best = min(rows, key=rows.get) if rows else "defaults"
route = "1" if best in ("route_in_gemv", "route_late_kv") else "0"
early = "0" if best in ("late_kv", "route_late_kv") else "1"
print(f"GOSSAMER_ROUTE_IN_GEMV={route} GOSSAMER_ATTN_EARLY_KV={early}")
PY
)
echo "chosen: $CHOICE"
TAILN=12 step decode 130 env $CHOICE python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1 --steps 64 --json $R/decode.json
TAILN=24 step spec_e2e 120 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,auto,auto-noguard --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
