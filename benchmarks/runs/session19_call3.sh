#!/usr/bin/env bash
# Prepared in session 18 (no machine was lent). #8's C=64 bar, ~9 min. The grouped v2 kernels'
# tile sweep has never run at BLOCK_M 8: the fourth session's (36 configs a kernel: REP x
# GROUPS_PER_STEP, NUM_STAGES 2-4, 4 / 8 warps) ran when 64 tokens took BLOCK_M 16, and the
# thirteenth session's move to 8 rows (mma.sync) timed the defaults on 4 and 8 warps only.
# Offline (benchmarks/sass_counts.py, triton 3.6): at BLOCK_M 8 NUM_STAGES 2 takes 233 / 238
# instructions a loop against 249 / 250 at 3 (gate_up / down). (1) The sweep at 64 tokens, its
# best pair confirmed at 128 (still BLOCK_M 8) and 256 (BLOCK_M 16); (2) the C=64 bar itself
# (throughput.py, not re-run since session 13's 2,347.5 tok/s). If a config wins at 64 and 128,
# give BLOCK_M 8 its own v2 configs (GROUPED_V2_GATE_UP / _DOWN serve every BLOCK_M now).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s19c3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c3; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step v2_sweep_bm8 380 python3 benchmarks/moe_grouped_sweep.py --tokens 64 --confirm 128,256 --json $R/v2_sweep_bm8.json
TAILN=4 step tp120_c64 190 python3 benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --concurrency 64 --output-len 1024 --json $R/tp120_c64.json
