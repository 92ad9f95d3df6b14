#!/usr/bin/env bash
# Prepared in session 18 (no machine was lent). #8's C=64 bar, ~9.5 min. At 64 tokens of 120b the
# grouped v2 kernels take tiles of 8 rows (mma.sync), and offline (benchmarks/sass_counts.py,
# triton 3.6) their loop is 249 / 250 instructions (gate_up / down); session 18's mma.sync K order
# (moe_mxfp4.V2_SYNC_ORDER, off) makes each thread's weight words one 16-byte shared-memory load,
# drops the scale shuffles and the activations' register moves: 224 / 227, and 203 / 204 with 2
# pipeline stages instead of 3. The
# tile sweep has never run at BLOCK_M 8 (the fourth session's ran when 64 tokens took BLOCK_M 16).
# (1) GPU tests of v2 (the sync order at 2 and 3 stages included); (2) one 120b MoE layer at 64
# and 128 tokens: sync order off / on x 2 / 3 stages, interleaved; (3) the whole tile sweep at 64
# tokens with the sync order on, its best confirmed at 128 and 256 (BLOCK_M 16 there). If the sync
# order wins, turn it on; if a config wins at 64 and 128, give BLOCK_M 8 its own v2 configs
# (GROUPED_V2_GATE_UP / _DOWN serve every BLOCK_M now). Then (a later call) throughput.py at C=64
# (2,347.5 tok/s in session 13; not re-run since).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s19c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step v2_tests 90 python3 -m pytest tests/kernels/test_moe_mxfp4.py -m gpu -k "v2" -p no:cacheprovider -q --tb=short -rf
TAILN=20 step sync_ab 130 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm 128 --json $R/sync_ab.json
TAILN=12 step v2_sweep_bm8 340 env GOSSAMER_V2_SYNC_ORDER=1 python3 benchmarks/moe_grouped_sweep.py --tokens 64 --confirm 128,256 --json $R/v2_sweep_bm8.json
