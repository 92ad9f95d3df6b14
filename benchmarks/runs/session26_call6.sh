#!/usr/bin/env bash
# Session 26, call 6 (not run: for the next H200; ~8 min). The H200's batch-64 step (25.65 ms) is
# 0.7 ms slower than session 13's (24.92) while the H100's got 2.8 ms faster: session 21's 8-row MoE
# tile (8 scale groups a step) was tuned on an H100. In order of need:
# 1. the C=64 bar's command with the 8-group tile (default) and the 4-group one
#    (GOSSAMER_V2_M8_GROUPS=4), twice each, interleaved;
# 2. one 120b MoE layer at 64 tokens (8-row tiles): groups 4 / 8 x stages 3 / 4 / 5, 4 warps;
# 3. the batch-64 step profile and its graph timeline (the bar's per-kernel times on its card), then
#    Nsight Compute on the two MoE kernels at batch 64 (stall reasons: issue, latency or bytes).
# On an H100 it runs 1 and 2 only (with --kv-cache-gib 10), as a control.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s26c6; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
KV="--kv-cache-gib 10"
grep -q H200 $R/gpu.txt && KV=""
TP="benchmarks/throughput.py --input-len 1024 --models gpt-oss-120b --output-len 1024 --concurrency 64 $KV"
for round in 1 2; do
  TAILN=3 step tp120_c64_g8_r$round 150 python3 $TP --json $R/tp120_c64_g8_r$round.json
  TAILN=3 GOSSAMER_V2_M8_GROUPS=4 step tp120_c64_g4_r$round 100 python3 $TP --json $R/tp120_c64_g4_r$round.json
done
TAILN=16 step moe_m8_sweep 150 python3 benchmarks/moe_grouped_sweep.py --tokens 64 --block-m 8 --tiles 1x4,1x8 --stages 3,4,5 --sweep-warps 4 --confirm 128 --json $R/moe_m8_sweep.json
if grep -q H200 $R/gpu.txt; then
  TAILN=24 step profile120_b64 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64 --context 1024 --top 20 --json $R/profile120_b64.json
  TAILN=22 step timeline_b64 90 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --profile-steps 4 --timed-steps 32 --top 18 --json $R/timeline_b64.json
  TAILN=30 step ncu_b64 150 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R/ncu -k regex:_v2_
fi
