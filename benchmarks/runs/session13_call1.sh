#!/usr/bin/env bash
# Prepared by session 12 for the next session (NOTES.md, "twelfth session's view"); not yet run.
# #8: a whole 20b batch-1 step under ncu (all ~220 launches: the unembedding and sampling too).
# (Its first step, the v2 MoE kernels' instruction statistics, ran as session12_call6.sh.)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s13c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s13c1; return $rc; }
TAILN=30 step ncu_20b_step 240 bash benchmarks/ncu_step.sh gpt-oss-20b 1 $R
