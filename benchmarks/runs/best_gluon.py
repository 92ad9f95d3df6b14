"""Print the fastest Gluon variant of a gluon_moe_ab.py JSON at --tokens, and exit 1 unless it
beats v2 there (median of the rounds): `GOSSAMER_MOE_GLUON_*` settings for a run of the model."""

import argparse
import json
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/runs/", 1)[0])
from gluon_moe_ab import gluon_options  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("path")
parser.add_argument("--tokens", type=int, default=8192)
args = parser.parse_args()
rows = [r for r in json.load(open(args.path))["rows"] if r["tokens"] == args.tokens and r["ok"]]
medians = {v: statistics.median(r["us"] for r in rows if r["variant"] == v)
           for v in {r["variant"] for r in rows}}  # fmt: skip
best = min((v for v in medians if v != "v2"), key=medians.get)
options = gluon_options(best)
print(
    f"GOSSAMER_MOE_GLUON_BLOCK_M={options['block_m']} GOSSAMER_MOE_GLUON_WARPS="
    f"{options['num_warps']} GOSSAMER_MOE_GLUON_MAXNREG={options['maxnreg'] or 0}"
)
sys.exit(0 if medians[best] < medians.get("v2", float("inf")) else 1)
