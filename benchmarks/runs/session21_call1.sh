#!/usr/bin/env bash
# Session 21, call 1 (H200 with today's defaults: GREEDY_IN_GRAPH, ADVANCE_IN_GRAPH and
# CONTEXT_GRAPHS on). (1) tests/spec/test_calibrate.py's GPU test alone, serially (the one failure
# of session 20's 4-worker run; with the switches off if it fails); (2) decode_speed.py at batch 1
# for 120b and 20b at 1k and 8k context: README's numbers with the defaults; (3) v2's mma.sync K
# order A/B on one 120b MoE layer at 64 tokens. ~8.5 min.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s21c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s21c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
CAL="tests/spec/test_calibrate.py -m gpu -p no:cacheprovider -q --tb=short -rf -s"
TAILN=6 step calibrate_on 80 python3 -m pytest $CAL ||
TAILN=6 step calibrate_off 60 env GOSSAMER_GREEDY_IN_GRAPH=0 GOSSAMER_ADVANCE_IN_GRAPH=0 GOSSAMER_CONTEXT_GRAPHS=0 python3 -m pytest $CAL
TAILN=16 step decode_b1 330 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1 --steps 64 --json $R/decode_b1.json
TAILN=12 step sync_ab 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm "" --json $R/sync_ab.json
