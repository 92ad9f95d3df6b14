#!/usr/bin/env bash
# Session 4, fourth device call: the expert-grouped fp16 MoE GEMV (GPU tests, comparison with the
# decode GEMV and grouped v2, whole decode steps with it at batch 16-64; call 3 has them without), then a
# draft model for mini and the draft / EAGLE-3 proposers end to end (chains and trees).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s4c4; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s4c4; return $rc; }
TAILN=8 step gg_tests 50 python3 -m pytest tests/kernels/test_moe_grouped_gemv.py -m gpu -q -p no:cacheprovider -rf --tb=line
TAILN=20 step gg_compare 80 python3 benchmarks/moe_grouped_gemv_sweep.py --tokens 16,32,64,128 --quick --json $R/gg_compare.json
TAILN=6 step decode_gg 80 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 16,32,64 --steps 16 --moe-max-pairs 4 --grouped-gemv-max-pairs 256 --json $R/decode_gg.json
TAILN=6 step train_draft 140 python3 -m tools.mini.train --preset draft --out out/mini-draft
TAILN=20 step spec_e2e 150 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini --draft out/mini-draft --eagle3 out/eagle3-mini/head --methods none,draft,eagle3 --tree 3,1,1,1 --batch-sizes 1,8 --max-tokens 256 --json $R/spec_e2e.json
