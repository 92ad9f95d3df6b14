#!/usr/bin/env bash
# Prepared in session 15 for the next session (not run yet). #8, 20b batch 1 (-37 us a step from
# 1.466 ms): (1) GPU tests of the gate_up GEMV reading gate_up packed by program
# (moe_mxfp4.PACKED_GATE_UP, off; bit-equal to the row-major read on the CPU and in SASS-identical
# default code); (2) chain_floor's all_gate_up_packed (only gate_up repacked: the buildable part of
# all_experts_packed's 66 / 101 us); (3) the model with packed_gate_up against the defaults, 20b and
# 120b, interleaved, fed. Then give the whole GPU suite a call of its own (gpu_tests.sh): session
# 15 did not finish tests/spec's last five.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s16c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s16c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=8 step gpu_tests 150 python3 -m pytest -m gpu tests/kernels/test_packed_gate_up.py tests/kernels/test_moe_mxfp4.py tests/kernels/test_route_in_experts.py -p no:cacheprovider -q --tb=short -rf
TAILN=12 step chain_floor 110 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json
TAILN=8 step ab_20b 120 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,packed_gate_up --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b.json
TAILN=8 step ab_120b 150 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,packed_gate_up --interleave --fed --rounds 5 --steps 32 --json $R/ab_120b.json
