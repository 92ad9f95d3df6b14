"""One gpt-oss-120b MoE layer in each MXFP4 word layout (gossamer/model/mxfp4.py LANE_LAYOUTS).

    python benchmarks/word_layouts_ab.py [--tokens 1,64,256,4096] [--rounds 3] [--json PATH]

The layouts trade the batch-1 GEMVs' fp16 unpack against the grouped v2 kernel's bf16 one
(`benchmarks/unpack_layouts.py`; offline instruction counts: `sass_counts.py --layouts`). Each
token count runs the default dispatch (`moe_mxfp4.moe_mxfp4`: the GEMV at 1 token, v2's 8-row
tile at 64, 16 rows at 256, prefill tiles at 4096) on the same random words labelled with each
layout in turn (random bytes are random codes in every layout), the layouts interleaved over
--rounds rounds, each call checked once against the torch reference. Timed as the model runs
it: several back-to-back calls with different routings in one CUDA graph (kernels_moe.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from kernels_moe import (
    ALPHA,
    LIMIT,
    TOP_K,
    ab_setup,
    calls_per_graph,
    check,
    floor_bytes,
    make_calls,
    print_medians,
    write_rows,
)
from timing import graph_seconds_per_call

from gossamer.kernels import moe_mxfp4 as moe
from gossamer.model import mxfp4


def time_layout(experts, layout: str, calls, bandwidth: float) -> dict:
    labelled = dataclasses.replace(experts, layout=layout)

    def fn(x, logits):
        return moe.moe_mxfp4(x, logits, labelled, TOP_K, LIMIT, ALPHA)

    ok, err = check(fn, labelled, *calls[0])
    seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
    # the GEMV reads each routed expert once per token; the grouped path each distinct expert
    path = 1 if calls[0][0].shape[0] == 1 else 0
    floor = statistics.mean(floor_bytes(lg)[path] for _, lg in calls) / bandwidth
    return {"layout": layout, "tokens": calls[0][0].shape[0], "us": seconds * 1e6,
            "floor_us": floor * 1e6, "ok": ok, "rel_err": err}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", default="1,64,256,4096")
    parser.add_argument("--layouts", default=",".join(mxfp4.LANE_LAYOUTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bandwidth, experts = ab_setup()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
        for _ in range(args.rounds):
            for layout in args.layouts.split(","):
                row = time_layout(experts, layout, calls, bandwidth)
                print(f"T={tokens:5d} {layout:12s} {row['us']:9.1f} us  floor "
                      f"{row['floor_us']:8.1f}  ok={row['ok']} err={row['rel_err']:.1e}",
                      flush=True)  # fmt: skip
                rows.append(row)
    print_medians(rows, "layout", args.layouts.split(","))
    path = args.json or os.path.join(os.environ.get("OUT", "."), "word_layouts_ab.json")
    write_rows(path, rows, bandwidth)


if __name__ == "__main__":
    main()
