#!/usr/bin/env bash
# Prepared in session 18 (no machine was lent). #8's C=64 bar, ~9.5 min. At 64 tokens of 120b the
# grouped v2 kernels take tiles of 8 rows (mma.sync), and offline (benchmarks/sass_counts.py,
# triton 3.6) their loop is 249 / 250 instructions (gate_up / down); session 18's mma.sync K order
# (moe_mxfp4.V2_SYNC_ORDER, off) makes each thread's weight words one 16-byte shared-memory load,
# drops the scale shuffles and the activations' register moves: 224 / 227, and 203 / 204 with 2
# pipeline stages instead of 3. The
# tile sweep has never run at BLOCK_M 8 (the fourth session's ran when 64 tokens took BLOCK_M 16).
# Trimmed in session 19 to fit the session's device time after calls 1 and 2 (the BLOCK_M 8 tile
# sweep, `GOSSAMER_V2_SYNC_ORDER=1 moe_grouped_sweep.py --tokens 64 --confirm 128,256`, ~340 s,
# waits): (1) GPU tests of v2 (the sync order at 2 and 3 stages included); (2) one 120b MoE layer
# at 64 tokens: sync order off / on x 2 / 3 stages, interleaved; (3) throughput.py at C=64 with
# the sync order on, then with the defaults (2,347.5 tok/s in session 13; not re-run since).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s19c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=6 step v2_tests 90 python3 -m pytest tests/kernels/test_moe_mxfp4.py -m gpu -k "v2" -p no:cacheprovider -q --tb=short -rf
TAILN=12 step sync_ab 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm "" --json $R/sync_ab.json
TAILN=4 step tp120_c64_sync 160 env GOSSAMER_V2_SYNC_ORDER=1 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64_sync.json
TAILN=4 step tp120_c64 160 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
