#!/usr/bin/env bash
# Prepared in session 14 for the next session (not run yet). #8: does reading QKV and O from
# tile-packed copies close the batch-1 GEMVs' gap to the streaming chain? (1) GPU tests of the
# packed GEMV (bit-equal to the row-major one); (2) chain_floor.py's packed modes (the GEMV's tiles
# and grid, no arithmetic, from a tile-by-tile repack) beside the row-major tiled ones; (3) the
# model's batch-1 step with gemv.USE_PACKED against the defaults (and on wider packed tiles: 20b),
# 20b and 120b, interleaved, fed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s15c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s15c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step gpu_tests 200 python3 -m pytest -m gpu tests/kernels/test_gemv.py tests/kernels/test_norm_linear.py -p no:cacheprovider -q --tb=short
TAILN=34 step chain_floor 150 python3 benchmarks/chain_floor.py --models gpt-oss-20b,gpt-oss-120b --context 1024 --json $R/chain_floor.json
TAILN=12 step ab_20b 200 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,packed,packed_64x64w4p4,packed_64x128w4p4,packed_128x64w8p4,packed_64x128w8p2 --interleave --fed --rounds 4 --steps 32 --json $R/ab_20b.json
TAILN=8 step ab_120b 180 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,packed --interleave --fed --rounds 6 --steps 32 --json $R/ab_120b.json
