#!/usr/bin/env bash
# Session 39 (either card). `bash benchmarks/runs/session39.sh check` (~5 min): the decode
# attention's early first tile now only where QKV is a Triton GEMV launch (<= 8 rows; call 1
# measured the batch-64 step without it 25.09 -> 24.69 ms fed): its GPU tests, the batch-64 step
# in its graph, README's C=64 on this card. `... ncu` (~4 min): where the batch-1 expert GEMVs'
# warps wait, per SASS instruction (gate_up runs at 75% of its byte floor on the H100 and neither
# its instructions nor its occupancy explained it: NOTES, thirty-eighth session, item 2).
# `... keys32` (~5 min): the batch-64 step with GOSSAMER_ATTN_MANY_PROGRAMS_BLOCK_N=32 (unsplit
# decode launches past 3 programs an SM on 32-key tiles: 114 registers, one wave) and without
# (the switch was removed after this run: 32-key tiles lost on full layers). `... l2` (~6 min):
# the batch-1 gate_up asking for its rows in L2 as each program starts (moe_mxfp4's
# GATE_UP_PREFETCH_L2), its tests on the GPU and the fed A/B on 120b (WITH_20B=1: 20b too).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
check() {
    R=/tmp/s39check; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
    TAILN=4 step gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_rope_fused.py -rfE
    TAILN=8 step timeline_b64 150 python3 benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --top 6 --json $R/timeline_b64.json
    TAILN=3 step tp120_c64 110 python3 benchmarks/throughput.py --input-len 1024 --output-len 1024 --models gpt-oss-120b --concurrency 64 --json $R/tp120_c64.json
}
ncu_gemvs() {
    R=/tmp/s39ncu; . benchmarks/runs/step.sh
    ncu --version | tail -1 | tee $R/gpu.txt
    local NCU="ncu --clock-control none --profile-from-start off --target-processes all --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no"
    TAILN=3 step src 200 $NCU -k regex:_fp16_ -c 2 -o $R/src python3 benchmarks/ncu_step.py run --model gpt-oss-120b --batch 1
    TAILN=1 step page 40 ncu --import $R/src.ncu-rep --page source --csv --print-source sass --log-file $R/src.csv
    TAILN=60 step table 20 python3 benchmarks/ncu_source.py $R/src.csv --top 16
    TAILN=1 step details 30 ncu --import $R/src.ncu-rep --page details --csv --log-file $R/details.csv
}
keys32() {  # the batch-64 step with unsplit crowded decode launches on 32-key tiles, and without
    R=/tmp/s39keys; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
    local TL="benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64 --top 6"
    TAILN=8 step timeline_b64_keys32 150 env GOSSAMER_ATTN_MANY_PROGRAMS_BLOCK_N=32 python3 $TL --json $R/timeline_b64_keys32.json
    TAILN=8 step timeline_b64 150 python3 $TL --json $R/timeline_b64.json
    TAILN=8 step timeline_b64_keys32_again 150 env GOSSAMER_ATTN_MANY_PROGRAMS_BLOCK_N=32 python3 $TL --json $R/timeline_b64_keys32_again.json
}
l2() {  # gate_up's rows asked into L2 as each program starts (PREFETCH_L2 1: scales, 2: and words)
    R=/tmp/s39l2; . benchmarks/runs/step.sh
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
    local AB="benchmarks/fusion_ab.py --interleave --fed --steps 32 --variants defaults,gu_l2_scales,gu_l2_words"
    TAILN=8 step ab_120b 170 python3 $AB --models gpt-oss-120b --rounds 4 --json $R/ab_120b.json
    TAILN=4 step tests 120 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_moe_mxfp4.py -k "prefetch_to_l2 or row_block_lines" -rfE
    [ "${WITH_20B:-0}" = 1 ] && TAILN=8 step ab_20b 120 python3 $AB --models gpt-oss-20b --rounds 3 --json $R/ab_20b.json
}
case ${1:-check} in
    check) check ;;
    ncu) ncu_gemvs ;;
    keys32) keys32 ;;
    l2) l2 ;;
esac
