#!/usr/bin/env bash
# Session 22, call 5: NOT RUN (the session's device time ran out; refused). Ready for the next one:
# v2's 64- and 128-row tiles with
# each step waiting for its wgmmas (_V2_ASYNC_MMA_MAX_M: the async ones raced with the next step's
# register writes, call 4), and the 32- and 16-row tiles both ways (GOSSAMER_V2_ASYNC_MMA_MAX_M=16 /
# 8 makes them wait; benchmarks/wgmma_hazards.py finds the same register hazards in them). One 120b MoE layer at 1024 and 8192 tokens; `ok` is the check against the reference.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s22c5; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s22c5; return $rc; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
TAILN=8 step tall_wait 70 python3 benchmarks/moe_grouped_sweep.py --block-ms 64,128,32 --warps 8 --tokens 1024 --confirm 8192 --json $R/tall_wait.json
TAILN=4 step m32_wait 40 env GOSSAMER_V2_ASYNC_MMA_MAX_M=16 python3 benchmarks/moe_grouped_sweep.py --block-ms 32 --warps 8 --tokens 1024 --confirm 8192 --json $R/m32_wait.json
# the 16-row tile (C=128-256 decode) with and without the wait, at 256 tokens (4 warps, its config)
TAILN=4 step m16 40 python3 benchmarks/moe_grouped_sweep.py --block-ms 16 --warps 4 --tokens 256 --confirm "" --json $R/m16.json
TAILN=4 step m16_wait 40 env GOSSAMER_V2_ASYNC_MMA_MAX_M=8 python3 benchmarks/moe_grouped_sweep.py --block-ms 16 --warps 4 --tokens 256 --confirm "" --json $R/m16_wait.json
