#!/usr/bin/env bash
# Session 11, calls 6 and 7 (commit 734e979: test_guard's GPU test as three interleaved rounds of
# new 256-token batches on one engine each, compared by medians). Call 6 kept only the tail of
# the output (0.82x); call 7, on the warm machine, printed the speeds (0.84x). Both failed.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=short 2>&1 | grep -v "warming up" | tail -8 | tee $OUT/guard_test.log
python3 -m pytest -m gpu tests/spec/test_guard.py -p no:cacheprovider -q -s --tb=line 2>&1 | grep -E "tok/s|passed|failed|assert"
