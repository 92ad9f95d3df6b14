#!/usr/bin/env bash
# Everything the GPU numbers in BENCHMARKS.md come from, in one device call:
#   bash benchmarks/device_suite.sh [quick]      (BENCH_KERNELS=... picks kernel benchmarks)
# GPU tests, the GEMV sweep (and the MoE sweep with MOE_SWEEP=1), decode speed with the swept
# configs (120b and 20b dummy weights; TRANSFORMERS=1 times transformers beside), speculative
# decoding, per-kernel benchmarks, engine host overhead. Variables: GPU_TESTS, SKIP_TESTS,
# SKIP_GEMV_SWEEP, DECODE_ARGS (extra decode_speed.py flags), EAGLE3_HEAD. Logs and JSON are packed into $OUT/results.tgz after every step, so a call
# cut short still returns what finished (the device returns at most 8 files).
# Optional, off by default (issue #8), run last: PROFILE=1 runs benchmarks/step_profile.py (the
# kernels of one decode step; PROFILE_ARGS, 2-3 min), THROUGHPUT=1 runs benchmarks/throughput.py
# (engine output tok/s at concurrency 16/64/256, 1k in / 1k out; THROUGHPUT_ARGS, e.g. "--models
# gpt-oss-20b"; both models take about 6 min). After the default steps a 10-minute call has no
# room for the throughput run: give it a call of its own (python3 benchmarks/throughput.py ...).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the repo, uninstalled
FINAL=${OUT:-$PWD/out}
R=/tmp/gossamer_results
mkdir -p "$R" "$FINAL"
export OUT=$R  # the benchmark scripts write their JSON to $OUT
step() {  # step NAME TIMEOUT COMMAND...: run with a time limit, keep the log, show its tail
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  echo "exit $?" >> "$R/$name.log"
  tail -n 30 "$R/$name.log"
  tar czf "$FINAL/results.tgz" -C /tmp gossamer_results
}
{ nvidia-smi; python3 -c "import torch, triton, transformers, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } > "$R/env.log" 2>&1
tail -n 2 "$R/env.log"
GPU_TESTS=${GPU_TESTS:-tests/kernels tests/spec}
[ "${SKIP_TESTS:-}" ] || step gpu_tests 200 python3 -m pytest $GPU_TESTS -m gpu -q -p no:cacheprovider
# Sweeps first: decode_speed runs with the configs they measured best (benchmarks/tuning.py).
[ "${SKIP_GEMV_SWEEP:-}" ] || step gemv_sweep 150 python3 benchmarks/gemv_sweep.py --out "$R/gemv_sweep.json"
[ "${MOE_SWEEP:-}" ] && step moe_decode_sweep 120 python3 benchmarks/moe_decode_sweep.py --json "$R/moe_sweep.json"
TUNED=""
[ -s "$R/gemv_sweep.json" ] && TUNED="$TUNED --gemv-sweep $R/gemv_sweep.json"
[ -s "$R/moe_sweep.json" ] && TUNED="$TUNED --moe-sweep $R/moe_sweep.json"
step decode_speed 240 python3 benchmarks/decode_speed.py ${TRANSFORMERS:+--transformers} $TUNED \
  ${DECODE_ARGS:-} --json "$R/decode_speed.json"
step spec_verify_cost 90 python3 benchmarks/spec_decode.py verify-cost --model gpt-oss-120b \
  --load-format dummy --batch-sizes 1,8 --ks 0,1,2,3,4 --context 1024 --json "$R/spec_verify.json"
# EAGLE3_HEAD: a head from tools/eagle3/train_mini.py (carried in; checkpoints are not committed)
step spec_e2e_mini 150 python3 benchmarks/spec_decode.py e2e --model gossamer/models/gpt-oss-mini \
  --methods none,ngram,suffix${EAGLE3_HEAD:+,eagle3} ${EAGLE3_HEAD:+--eagle3 $EAGLE3_HEAD} \
  --batch-sizes 1,8 --max-tokens 256 --json "$R/spec_e2e_mini.json"
if [ "${1:-}" != "quick" ]; then
  for bench in ${BENCH_KERNELS:-kernels_moe kernels_attention kernels_small moe_decode_sweep}; do
    step "$bench" 120 python3 "benchmarks/$bench.py"
  done
fi
step engine_overhead 30 python3 benchmarks/engine_step_overhead.py --json "$R/engine_overhead.json"
if [ "${PROFILE:-}" ]; then
  step step_profile 240 python3 benchmarks/step_profile.py ${PROFILE_ARGS:-} --json "$R/step_profile.json"
fi
if [ "${THROUGHPUT:-}" ]; then
  step throughput 540 python3 benchmarks/throughput.py ${THROUGHPUT_ARGS:-} --json "$R/throughput.json"
fi
