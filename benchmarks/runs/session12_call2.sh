#!/usr/bin/env bash
# Session 12, call 2. #7: the guard GPU test with the engines taking turns A B / B A over eight
# rounds (judged by the median of each round's ratio), and the guard's books over eight rounds of
# interleaved engines. #8: decode attention's sliding-window layers in one split of the whole
# window (attention.SLIDING_WHOLE_WINDOW) against the defaults, 20b and 120b at batch 1, fed,
# interleaved; and its GPU test. Each step has its own time limit; a failing step does not stop
# the others.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c2; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c2; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step guard_test 200 python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=short
TAILN=3 step ga_rounds 100 python3 benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini --batch-sizes 8 --max-tokens 256 --rounds 8 --json $R/ga_rounds.json
TAILN=4 step attn_test 60 python3 -m pytest -m gpu tests/kernels/test_attention.py -k "one_split or gpu_decode" -p no:cacheprovider -q --tb=short
TAILN=6 step ab_20b 130 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,sliding_whole --interleave --fed --rounds 8 --steps 32 --json $R/ab_20b.json
TAILN=6 step ab_120b 170 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,sliding_whole --interleave --fed --rounds 8 --steps 32 --json $R/ab_120b.json
