#!/usr/bin/env bash
# Session 38, either card (~9 min). On an H200: session38_h200.sh (the batch-1 defaults of session
# 37 against the old ones, and on 20b's routing GEMVs). Otherwise (H100): the batch-1 expert GEMVs'
# tiles again under the whole-step loop (WHOLE_STEPS 2, gate_up's SCALES_T: the defaults since
# session 37, which every variant keeps unless it names them), fed 120b graph, interleaved rounds.
# Picked from `sass_counts.py --tiles` (registers, programs an SM, waves): gate_up 8 pairs on 2 / 4
# warps (1,440 programs), 8 groups a step (48 registers: 10 programs an SM, 0.55 waves),
# whole_4_scales_t (64 registers: 8 an SM), down on 2 warps, 2 rows, 8 groups a step (63
# registers, 2.89 instructions a weight against 3.10).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && exec bash benchmarks/runs/session38_h200.sh
R=/tmp/s38any; . benchmarks/runs/step.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 3 --steps 32"
V=defaults,gu_p8w2,gu_p8w4,gu_g8,whole_4_scales_t,dn_w2,dn_r2w1,dn_g8
TAILN=6 step tiles_120b 560 python3 $AB --models gpt-oss-120b --variants $V --json $R/tiles_120b.json
