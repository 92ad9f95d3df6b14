"""Exit 0 if the padded scales' layer (moe_grouped_sweep.py --sync-ab --ab-padded 0,1 --json F)
was faster at 64 tokens by 1% or more, else 1: the device-call scripts run their C=64 A/B only then.

    python3 benchmarks/runs/padded_wins.py F
"""

import json
import statistics
import sys

rows = [r for r in json.load(open(sys.argv[1]))["sync_rows"] if r["tokens"] == 64]
mean = {p: statistics.mean(r["us"] for r in rows if r["padded"] == p) for p in (False, True)}
print("layer at 64 tokens, mean us:", mean)
sys.exit(0 if mean[True] < 0.99 * mean[False] else 1)
