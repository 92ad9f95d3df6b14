#!/usr/bin/env bash
# Session 39, for an H200 (README's numbers are H200 numbers; C=256 at README's KV budget does not
# fit an H100). `bash benchmarks/runs/session39_h200.sh` (~9 min, most wanted first): README's
# C=64 and C=256 with today's defaults (the last H200 runs were sessions 31 and 32; since then the
# batch-1 GEMV changes and, at batch >= 9, the decode attention without its early first tile),
# the first batch-64 and batch-256 step profiles on this card, then batch 1 of both models through
# the engine. `... layouts` (~9 min, the warm machine): v2's 8-row tile at 64 and 256 tokens
# with more programs an SM (maxnreg 80 / 72) and 4 stages: on the H100 they lost (session 30),
# but there the tile is nearer its byte floor, and the H200 runs one layer at about the H100's
# time (589 against ~577 us at 64 tokens), so its limit is latency or issue, which more warps and
# bytes in flight address; then session35_h200.sh's layer A/B of the word layouts and README's
# C=64 in the winner, then session 37's batch-1 defaults against the masked loop.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024"
readme() {
    R=/tmp/s39h200; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
    TAILN=3 step tp120_c64 110 python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64.json
    grep -q H200 $R/gpu.txt || exit 0
    TAILN=3 step tp120_c256 150 python3 $TP --models gpt-oss-120b --concurrency 256 --json $R/tp120_c256.json
    TAILN=34 step profile_b64_b256 170 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 64,256 --context 1024 --top 16 --json $R/profile_b64_b256.json
    TAILN=3 step tp120_c1 80 python3 $TP --models gpt-oss-120b --concurrency 1 --json $R/tp120_c1.json
    TAILN=3 step tp20_c1 60 python3 $TP --models gpt-oss-20b --concurrency 1 --json $R/tp20_c1.json
}
layouts() {
    R=/tmp/s39h200b; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
    TAILN=20 step v2_tile 200 python3 benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm 256 --ab-orders 1 --ab-stages 3,4 --ab-maxnreg 0,80,72 --ab-rounds 2 --json $R/v2_tile.json
    TAILN=14 step layer_layouts 110 python3 benchmarks/word_layouts_ab.py --tokens 1,64,256 --rounds 3 --json $R/layer_layouts.json
    BEST=$(python3 benchmarks/runs/best_layout.py $R/layer_layouts.json --tokens 64) || BEST=fp16_lanes
    echo "layer winner at 64 tokens: $BEST" | tee $R/best.txt
    [ "$BEST" != fp16_lanes ] && TAILN=3 step tp120_c64_best 110 env GOSSAMER_MXFP4_LAYOUT=$BEST python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64_best.json
    AB="benchmarks/fusion_ab.py --interleave --fed --rounds 5 --steps 32"
    TAILN=6 step ab_120b 150 python3 $AB --models gpt-oss-120b --variants defaults,masked_steps --json $R/ab_120b.json
    TAILN=8 step ab_20b 150 python3 $AB --models gpt-oss-20b --variants defaults,masked_steps,whole_2_scales_t_routing --json $R/ab_20b.json
}
case ${1:-readme} in
    readme) readme ;;
    layouts) layouts ;;
esac
