#!/usr/bin/env bash
# Session 14, call 7. chain_floor.py again, now also with QKV and O read as the batch-1 GEMV tiles
# them (big_tiled / all_tiled): does the GEMV's access pattern alone cost what its excess over
# the streaming chain is?
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s14c7; mkdir -p $R
timeout 150 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json > $R/chain_floor.log 2>&1
echo "exit $?" >> $R/chain_floor.log; tail -n 32 $R/chain_floor.log; tar czf "$OUT/results.tgz" -C /tmp s14c7
