"""One gpt-oss-120b MoE layer at prefill sizes: v2's Triton kernels against the Gluon ones.

    python benchmarks/gluon_moe_ab.py [--tokens 1024,2048,4096,8192] [--rounds 3] [--json PATH]

`gossamer/kernels/moe_gluon.py` overlaps the dequantization of a step's weights with the previous
step's wgmmas, which v2's 64-row tile (`tl.dot`) cannot. Variants: `v2` (the default dispatch,
`moe_mxfp4.moe_mxfp4`), `gluon64` and `gluon128` (64- and 128-token tiles; a suffix `w4` for 4
warps a program, `r168` for 168 registers a thread: `gluon64w4r168`). Each token count runs
every variant on the same random experts and routings, interleaved over --rounds rounds, each
checked once against the torch reference, timed as the model runs them (back-to-back calls in one
CUDA graph, kernels_moe.py). Beside each time: the layer's matmul rate (6 H I FLOPs a routed
pair) and its byte floor (the experts it touches, at the copy bandwidth measured in the run).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics

from kernels_moe import (
    ALPHA,
    HIDDEN,
    INTER,
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

from gossamer.kernels import moe_gluon
from gossamer.kernels import moe_mxfp4 as moe

VARIANTS = ("v2", "gluon64", "gluon128")


def gluon_options(variant: str) -> dict:
    """ "gluon64w4r168" -> 64-token tiles, 4 warps, 168 registers a thread (w and r optional)."""
    match = re.fullmatch(r"gluon(\d+)(?:w(\d+))?(?:r(\d+))?", variant)
    if not match:
        raise SystemExit(f"unknown variant {variant!r}")
    block_m, warps, maxnreg = match.groups()
    return {"block_m": int(block_m), "num_warps": int(warps or moe_gluon.WARPS),
            "maxnreg": int(maxnreg) if maxnreg else None}  # fmt: skip


def variant_fn(variant: str, experts):
    if variant == "v2":
        return lambda x, logits: moe.moe_mxfp4(x, logits, experts, TOP_K, LIMIT, ALPHA)
    options = gluon_options(variant)
    return lambda x, logits: moe_gluon.moe_mxfp4_gluon(x, logits, experts, TOP_K, LIMIT, ALPHA,
                                                       **options)  # fmt: skip


def time_variant(variant: str, experts, calls, bandwidth: float) -> dict:
    fn = variant_fn(variant, experts)
    ok, err = check(fn, experts, *calls[0])
    seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
    tokens = calls[0][0].shape[0]
    floor = statistics.mean(floor_bytes(lg)[0] for _, lg in calls) / bandwidth
    flops = 6 * HIDDEN * INTER * tokens * TOP_K
    return {"variant": variant, "tokens": tokens, "us": seconds * 1e6, "floor_us": floor * 1e6,
            "tflops": flops / seconds / 1e12, "ok": ok, "rel_err": err}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", default="1024,2048,4096,8192")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = args.variants.split(",")
    bandwidth, experts = ab_setup()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
        for _ in range(args.rounds):
            for variant in variants:
                row = time_variant(variant, experts, calls, bandwidth)
                print(f"T={tokens:5d} {variant:9s} {row['us']:9.1f} us {row['tflops']:6.1f} "
                      f"TFLOP/s floor {row['floor_us']:7.1f} ok={row['ok']} "
                      f"err={row['rel_err']:.1e}", flush=True)  # fmt: skip
                rows.append(row)
    print_medians(rows, "variant", variants)
    path = args.json or os.path.join(os.environ.get("OUT", "."), "gluon_moe_ab.json")
    write_rows(path, rows, bandwidth)


if __name__ == "__main__":
    main()
