#!/usr/bin/env bash
# Session 12, call 6: session13_call1.sh's first step now (the device time was left): the grouped
# MoE v2 kernels at 64 tokens on 120b, one launch each, with ncu's instruction statistics.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s12c6; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s12c6; return $rc; }
TAILN=6 step ncu_v2 210 bash benchmarks/ncu_step.sh gpt-oss-120b 64 $R -k regex:_v2_ -c 2 --section InstructionStats --section SourceCounters
