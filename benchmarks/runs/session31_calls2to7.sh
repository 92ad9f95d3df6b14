#!/usr/bin/env bash
# Session 31, calls 2-7: what was run, one call each, on the H200 that call 1 (session31_call1.sh)
# left warm, while device time lasted. Results in benchmarks/runs/results/session31_call{2..7}.
# Call 7 ran after GOSSAMER_V2_PADDED_SCALES was limited to tiles of up to 16 rows (decode).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
TP="benchmarks/throughput.py --input-len 1024 --output-len 1024"
SW="benchmarks/moe_grouped_sweep.py --sync-ab --tokens 64 --confirm= --ab-groups 8 --ab-orders 1 --ab-stages 3 --ab-rounds 1"
NCU="ncu --clock-control none --target-processes all --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no"
call2() {  # README's C=256; C=64 padded then default (call 1 ran them in the other order)
    R=/tmp/s31c2; . benchmarks/runs/step.sh
    TAILN=4 step tp120_c256 200 python3 $TP --models gpt-oss-120b --concurrency 256 --json $R/tp120_c256.json
    TAILN=4 step tp120_c64_padded 120 env GOSSAMER_V2_PADDED_SCALES=1 python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64_padded.json
    TAILN=4 step tp120_c64 120 python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64.json
}
call3() {  # batch 1, 120b
    R=/tmp/s31c3; . benchmarks/runs/step.sh
    TAILN=4 step tp120_c1 150 python3 $TP --models gpt-oss-120b --concurrency 1 --json $R/tp120_c1.json
}
call4() {  # batch 1, 20b, and 120b again
    R=/tmp/s31c4; . benchmarks/runs/step.sh
    TAILN=4 step tp20_c1 100 python3 $TP --models gpt-oss-20b --concurrency 1 --json $R/tp20_c1.json
    TAILN=4 step tp120_c1_again 100 python3 $TP --models gpt-oss-120b --concurrency 1 --json $R/tp120_c1_again.json
}
ncu_source() {  # $1: 0 or 1 (padded scales): warp samples per SASS instruction, then the details
    local v=$1
    TAILN=3 step src_$v 60 $NCU -k regex:_v2_ -c 2 -o $R/src_$v python3 $SW --ab-padded $v
    TAILN=1 step page_$v 40 ncu --import $R/src_$v.ncu-rep --page source --csv --print-source sass --log-file $R/src_$v.csv
    TAILN=12 step table_$v 20 python3 benchmarks/ncu_source.py $R/src_$v.csv --top 10
    TAILN=1 step details_$v 30 ncu --import $R/src_$v.ncu-rep --page details --csv --log-file $R/details_$v.csv
}
call5() {  # the padded variant alone (its files are named src_padded, table_padded)
    R=/tmp/s31c5; . benchmarks/runs/step.sh
    ncu_source 1
}
call6() {  # default and padded in one call, with ncu's details (duration, issue, memory throughput)
    R=/tmp/s31c6; . benchmarks/runs/step.sh
    ncu_source 0
    ncu_source 1
}
call7() {  # C=64 with the padded scales on decode tiles only, then the default
    R=/tmp/s31c7; . benchmarks/runs/step.sh
    TAILN=3 step tp120_c64_padded_m16 80 env GOSSAMER_V2_PADDED_SCALES=1 python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64_padded_m16.json
    TAILN=3 step tp120_c64 80 python3 $TP --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64.json
}
"${1:-call2}"
