#!/usr/bin/env bash
# Session 11, calls 4 and 5 (the commands run on call 3's warm machine; same tree as call 3):
# call 3's `pytest -m gpu tests` stopped at collection (the server tests import openai, which the
# device image lacks), so the GPU test files are named. Call 4 ran out of its 420 s after 171 of
# 180 tests (all passed); call 5 ran the speculation GPU files that were left.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT/r
timeout 420 python3 -m pytest -m gpu tests/engine/test_async_scheduling_gpu.py tests/kernels tests/mini/test_mini_gpu.py tests/runner/test_pinned_uploads_gpu.py tests/spec -p no:cacheprovider -q --tb=short -rf --durations=10 > $OUT/r/gpu_tests.log 2>&1
timeout 170 python3 -m pytest -m gpu tests/spec/test_spec_gpu.py tests/spec/test_tree_graphs_gpu.py tests/spec/test_idle_overlap.py -p no:cacheprovider -q --tb=short -rf > $OUT/r/spec_gpu_tests.log 2>&1
