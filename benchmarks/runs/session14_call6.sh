#!/usr/bin/env bash
# Session 14, call 6. The GPU suite's last 11 tests, which call 5 did not reach in its limit
# (call 5 passed the first 184 of 195: all but test_spec_gpu.py's last 8 and test_tree_graphs_gpu.py).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c6; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
timeout 330 python3 -m pytest -m gpu tests/spec/test_spec_gpu.py tests/spec/test_tree_graphs_gpu.py -p no:cacheprovider -q --tb=short -rf --durations=8 > $R/spec_gpu.log 2>&1
echo "exit $?" >> $R/spec_gpu.log; tail -n 16 $R/spec_gpu.log; tar czf "$OUT/results.tgz" -C /tmp s14c6
