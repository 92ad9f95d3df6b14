"""Print the word layout whose MoE layer at --tokens was fastest in a word_layouts_ab.py JSON
(medians over its rounds), for the device scripts to run the model with it.

    python benchmarks/runs/best_layout.py RESULT.json [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics


def best_layout(rows: list[dict], tokens: int) -> str:
    medians = {}
    for layout in {r["layout"] for r in rows if r["tokens"] == tokens}:
        times = [r["us"] for r in rows if r["tokens"] == tokens and r["layout"] == layout]
        if all(r["ok"] for r in rows if r["layout"] == layout):  # wrong anywhere: out
            medians[layout] = statistics.median(times)
    return min(medians, key=medians.get)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with open(args.json) as f:
        print(best_layout(json.load(f)["rows"], args.tokens))


if __name__ == "__main__":
    main()
