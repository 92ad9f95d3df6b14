#!/usr/bin/env bash
# Session 38, call 2 (H100, the machine call 1 left warm, ~1 min): the two tiles closest to the
# defaults in call 1 (session38_any.sh) against them again in five rounds, and down's 8-group step
# on 20b (down's config reaches 20b's GEMVs that route themselves).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s38b; . benchmarks/runs/step.sh
AB="benchmarks/fusion_ab.py --interleave --fed --rounds 5 --steps 32"
TAILN=6 step confirm_120b 200 python3 $AB --models gpt-oss-120b --variants defaults,dn_g8,whole_4_scales_t --json $R/confirm_120b.json
TAILN=6 step confirm_20b 150 python3 $AB --models gpt-oss-20b --variants defaults,dn_g8 --json $R/confirm_20b.json
