#!/usr/bin/env bash
# Every GPU test (`-m gpu`), as the device can run them: its image has no openai, fastapi or
# openai-harmony, so the test modules that import those at the top (the server's, Harmony's, the
# end-to-end one; none has GPU tests) are left out of collection rather than failing it. The whole
# suite took ~8.5 min on the H200 in session 11 (calls 4 and 5, cold Triton cache): give it a
# call of its own. Extra arguments go to pytest (e.g. -x, --durations=10, a path to narrow it).
# With pytest-xdist (carried as wheels: benchmarks/runs/session20_call1.sh), `-n 4 --dist loadfile`
# ran the whole suite in 5.5 min on an H100 (session 20), Triton's cold compiles spread over the
# machine's cores; but the workers share the GPU, so tests/spec/test_calibrate.py's timing test
# (batch 16 no faster than batch 1) failed there; re-run it alone before reading it as a bug.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
# Unbuffered, so a log written to a file ends where pytest did, and inductor compiling in-process
# (no worker pool to wind down at exit): session 16's first run, with the torch.compile test
# (tests/mini/test_mini_gpu.py) on a cold cache, exited 0 without its summary line. (A guess at
# the cause, not confirmed. Session 15's run of the kernel and runner tests, without that test,
# hung after 100% for another reason not found.)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
python3 -m pytest -m gpu tests --ignore=tests/server --ignore=tests/harmony \
    --ignore=tests/test_end_to_end.py -p no:cacheprovider -q --tb=short -rf "$@"
