#!/usr/bin/env bash
# Session 28, call 1 (an H100: two tries for an H200 got none; ~5 min). NOTES item 2 of the
# twenty-seventh session: do v2's 8-row MoE kernels lose time to shared-memory bank conflicts?
# The TTGIR says the activations lose their swizzle when permuted after the load (the activation
# swap, the mma.sync order: fewer instructions, 3-21% slower), and the weights' words always
# reach registers through an unswizzled tile. Nsight Compute on one 120b layer at 64 tokens
# (moe_grouped_sweep.py: gate_up and down, twice each), the default and the two variants:
# bank conflicts of shared loads and stores, shared wavefronts, instructions, stalls.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s28c1; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 0 --ab-stages 3 --ab-rounds 1"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
METRICS="--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed.sum"
MATCH='bank_conflicts|wavefronts_mem_shared|inst_executed_op_shared|ldgsts|smsp__inst_executed.sum'
for variant in default:GOSSAMER_V2_ACT_SWAP=0 swap:GOSSAMER_V2_ACT_SWAP=1 sync:GOSSAMER_V2_SYNC_ORDER=1; do
    name=${variant%%:*}
    TAILN=4 step ncu_$name 150 env ${variant#*:} ncu --clock-control none --target-processes all \
        -k regex:_v2_ -c 4 $SECTIONS $METRICS --csv --page raw --log-file $R/ncu_$name.csv python3 $SW
    TAILN=40 step table_$name 30 python3 benchmarks/ncu_step.py summarize $R/ncu_$name.csv --pipes --stalls 6 --match "$MATCH"
done
