"""Print the environment that turns on the fastest split of tokens_per_expert_ab.py's JSON at
C=64's random routings, if it beats v2 there by at least 1% (else nothing), for the device
scripts to run the model with it.

    python benchmarks/runs/best_split.py RESULT.json
"""

from __future__ import annotations

import argparse
import json
import statistics

ENVS = {
    "split1": "GOSSAMER_V2_GEMV_MAX_COUNT=1",
    "split2": "GOSSAMER_V2_GEMV_MAX_COUNT=2",
    "split1_m32": "GOSSAMER_V2_GEMV_MAX_COUNT=1 GOSSAMER_V2_GEMV_M_PROGRAMS=32",
}


def best_split(rows: list[dict]) -> str:
    def median(path: str) -> float:
        return statistics.median(
            r["us"] for r in rows if r["path"] == path and r["per_expert"] == 0
        )

    splits = [path for path in ENVS if any(r["path"] == path for r in rows)]
    best = min(splits, key=median)
    return ENVS[best] if median(best) < 0.99 * median("v2") else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json")
    with open(parser.parse_args().json) as f:
        print(best_split(json.load(f)["rows"]))


if __name__ == "__main__":
    main()
