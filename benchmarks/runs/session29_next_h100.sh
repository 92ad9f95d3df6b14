#!/usr/bin/env bash
# For the next session if only an H100 comes (~9 min): the 8-row tile was tuned (session 21:
# 8 groups a step, 3 stages, 4 warps) in v2's K order; the mma.sync order, the default since
# session 29, changes its loads (4 LDS.128 instead of 16 four-byte loads a loop) and may want
# another tile. Offline (sm_90 SASS, instructions a weight, gate_up): 3.20 at 8 groups, 3.11 at
# 16, 3.06 at 2 stages, 3.15 at 8 warps, 2.97 at REP 2 (measured slower, session 29).
# 1. the tile sweep at 64 tokens (gate_up, then down; every config checked against the
#    reference), the best pair and the defaults confirmed at 64 and 128 tokens;
# 2. maxnreg 64 / 72 / 80 against ptxas's 88 registers (8 / 7 / 6 programs an SM instead of 5;
#    the loop 430 / 426 / 422 instructions against 409), in-process, 2 rounds;
# 3. Nsight Compute on one layer at 64 tokens (are the words' bank conflicts gone?).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s29nx; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
TAILN=12 step sweep_m8 240 python3 benchmarks/moe_grouped_sweep.py --block-m 8 --tokens 64 --confirm 128 --tiles 1x8,1x16 --stages 2,3,4 --sweep-warps 4,8 --json $R/sweep_m8.json
TAILN=9 step layer_maxnreg 110 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-stages 3 --ab-orders 1 --ab-maxnreg 0,64,72,80 --ab-rounds 2 --json $R/layer_maxnreg.json
# session 28's ncu step (session28_call1.sh) on the new default; its v2-order counters are there
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 1 --ab-stages 3 --ab-rounds 1"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
METRICS="--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed.sum"
MATCH='bank_conflicts|wavefronts_mem_shared|inst_executed_op_shared|ldgsts|smsp__inst_executed.sum'
TAILN=4 step ncu_sync 150 ncu --clock-control none --target-processes all -k regex:_v2_ -c 4 $SECTIONS $METRICS --csv --page raw --log-file $R/ncu_sync.csv python3 $SW
TAILN=40 step table_sync 30 python3 benchmarks/ncu_step.py summarize $R/ncu_sync.csv --pipes --stalls 6 --match "$MATCH"
