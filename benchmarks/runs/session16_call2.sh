#!/usr/bin/env bash
# Session 16, call 2 (two device calls, run inline; recorded here): the whole GPU suite. The first
# call left tests/spec out (402 s on a fresh machine: 189 passed); the second ran on the warm
# machine with tests/spec as an extra path, which pytest adds to gpu_tests.sh's `tests`, so it
# ran the whole suite again (235 s: 209 passed). Logs: benchmarks/runs/results/session16_call2/.
set -u
mkdir -p "$OUT"
timeout 560 bash benchmarks/gpu_tests.sh --ignore=tests/spec --durations=15 > "$OUT/gpu_tests_a.log" 2>&1
echo "exit $?"
timeout 500 bash benchmarks/gpu_tests.sh tests/spec --durations=25 -v > "$OUT/gpu_tests_spec.log" 2>&1
echo "exit $?"
