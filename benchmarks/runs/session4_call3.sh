#!/usr/bin/env bash
# Session 4, third device call: the MoE GEMV sweep on the repacked layout, the decode table with
# its best configs, speculative decoding end to end on mini (after the suffix fix and the
# cost-aware auto), and the engine's 1k-in/1k-out throughput rows.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s4c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s4c3; return $rc; }
TAILN=8 step moe_sweep 120 python3 benchmarks/moe_decode_sweep.py --json $R/moe_sweep.json
SWEEP=""; [ -s $R/moe_sweep.json ] && SWEEP="--moe-sweep $R/moe_sweep.json"
TAILN=16 step decode 130 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024,8192 --batch-sizes 1,16,32,64,256 --steps 32 $SWEEP --json $R/decode.json
TAILN=16 step spec_e2e 100 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --methods none,ngram,suffix,auto --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
TAILN=16 step throughput 230 python3 benchmarks/throughput.py --models gpt-oss-120b --json $R/throughput.json
