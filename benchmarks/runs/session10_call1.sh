#!/usr/bin/env bash
# Session 10, call 1 (commit: the one that adds this file; .base is 61a572f, the session's start):
# (.base holds no mini checkpoint: both trees load .clean's.)
# one upload per step (runner/step_buffers.py) against seven-eight copies. Plain decoding on mini
# (host bound at batch 8) and 120b batch-1 fed steps (must not get slower: the attention kernel
# now reads block tables through a block stride), alternating the two trees; then the GPU tests
# of everything that reads the runner's inputs.
set -u
export PYTHONUNBUFFERED=1
R=/tmp/s10c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s10c1; return $rc; }
NEW=$PWD; BASE=$PWD/../.base
E2E="benchmarks/spec_decode.py e2e --model $NEW/gossamer/models/gpt-oss-mini --methods none --batch-sizes 1,8 --max-tokens 512 --runs 3"
DEC="benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 1 --steps 256"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for round in 1 2; do
  for tree in new base; do
    dir=$NEW; [ $tree = base ] && dir=$BASE
    (cd $dir && export PYTHONPATH=$dir && TAILN=4 step e2e_${tree}_$round 150 python3 $E2E --json $R/e2e_${tree}_$round.json)
  done
done
for tree in new base; do
  dir=$NEW; [ $tree = base ] && dir=$BASE
  (cd $dir && export PYTHONPATH=$dir && TAILN=3 step dec120_${tree} 150 python3 $DEC --json $R/dec120_${tree}.json)
done
cd $NEW && export PYTHONPATH=$NEW && TAILN=10 step gpu_tests 240 python3 -m pytest -m gpu tests/runner/test_pinned_uploads_gpu.py tests/engine/test_async_scheduling_gpu.py tests/spec/test_tree_graphs_gpu.py tests/spec/test_guard.py tests/kernels/test_attention.py tests/kernels/test_attention_rope_fused.py tests/kernels/test_triton_model.py -p no:cacheprovider -q --tb=short -rf
