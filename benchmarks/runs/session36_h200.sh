#!/usr/bin/env bash
# Session 36, for an H200 with ~10 device minutes left (~5 min): session35_h200.sh without its
# C=256 runs (the word layouts' layer A/B at 1, 64 and 256 tokens, then README's C=64 in the
# layer's winner and in the default; the same rule).
C256=0 exec bash "$(dirname "$0")/session35_h200.sh"
