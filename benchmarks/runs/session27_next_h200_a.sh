#!/usr/bin/env bash
# For the next H200 (not run in session 27: five tries got no H200; C=256 in bf16 needs more than
# an H100's 78 GiB; ~9 min): session27_call2.sh again, which on an H200 also runs C=256 and ncu.
# Session 27's MoE changes (scales without clamps, the 12-instruction unpack of the repacked
# words; v2's 8-row loop 491 -> 447 instructions offline) gave one 120b layer at 64 tokens -1.5%
# and C=64 +2.1% on an H100, which is not issue-bound; session 12's ncu found the H200's grouped
# MoE issue-bound (71% issue use, `not_selected` on top), so the gain should be larger there.
# It runs: the layer new / old (GOSSAMER_MOE_OLD_UNPACK=1) in interleaved processes, with the
# mma.sync K order and 4 stages beside the default; 16-row tiles at 256 tokens; C=256 and C=64
# new, C=64 old (README's numbers); ncu on the two MoE kernels of the first two layers.
# The C=64 step's limit is 150 s here: session 27's cold loads took 70-78 s of its 100.
R=/tmp/s27na C64_LIMIT=150 exec bash "$(dirname "$0")/session27_call2.sh"
