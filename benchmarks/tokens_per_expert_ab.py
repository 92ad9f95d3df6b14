"""What a busy expert costs each MoE path as a function of its token count: grouped v2 (the
tensor-core tiles C=64 and C=256 decode through) against the expert-grouped fp16 GEMV, one
gpt-oss-120b layer, and what a per-expert split of the two would save at C=64.

    python benchmarks/tokens_per_expert_ab.py [--per-expert 1,2,3,4] [--rounds 3] [--json PATH]

At C=64 each step routes 256 pairs to ~111 of 128 experts: ~31% of the busy experts hold one
token, ~27% two (Poisson with mean 2). v2 dequantizes each busy expert's weights once whatever its
count (bf16 lanes, ~2.7-3.2 instructions a weight offline); the grouped GEMV unpacks fp16 lanes
and pays its HFMA2s per token (2.21 instructions a weight at one token, 1.49 a weight and token
at two: `moe_grouped_gemv.py`). So the GEMV should win on one-token experts and v2 from two or
three. Which, and by how much, decides whether the split (`moe_mxfp4.V2_GEMV_MAX_COUNT`: experts
of up to 1 or 2 pairs to the GEMV, the rest to v2, at ~3 extra launches a layer) pays; it is timed
too (split1, split2: the GEMV's grid 16 rows of programs, each taking every 16th small expert in
turn; split1_m32 with 32 rows; split1_rows with a row for every expert that could be small, the
first version, which cost ~88 us a layer where no expert was small).

Routing is crafted so that every expert holds exactly n tokens (T = 32 n tokens, token t to
experts 4t .. 4t + 3 mod 128): the layer's time / 128 is one busy expert's cost at n. Then the
same for the random routings of 64 tokens (C=64's step), and the split's estimate there from the
per-n costs (`split_estimate`: each busy expert on the cheaper path, no launch costs) beside its
measured time. Paths interleaved over --rounds rounds in CUDA graphs of back-to-back calls
(kernels_moe.py), each call checked once against the torch reference.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics

import torch
from kernels_moe import (
    ALPHA,
    DEVICE,
    DTYPE,
    EXPERTS,
    HIDDEN,
    LIMIT,
    TOP_K,
    ab_setup,
    calls_per_graph,
    check,
    make_calls,
    write_rows,
)
from timing import graph_seconds_per_call

from gossamer.kernels import moe_grouped_gemv, moe_mxfp4

# path -> (entry point, {(module, name): value} set while it is compiled and captured)
PATHS = {
    "v2": (moe_mxfp4.moe_mxfp4_grouped_v2, {}),
    "grouped_gemv": (moe_grouped_gemv.moe_mxfp4_grouped_gemv, {}),
    # one-pair experts to the GEMV, its grid 16 rows of programs taking every 16th in turn
    "split1": (moe_mxfp4.moe_mxfp4_grouped_v2, {(moe_mxfp4, "V2_GEMV_MAX_COUNT"): 1}),
    "split2": (moe_mxfp4.moe_mxfp4_grouped_v2, {(moe_mxfp4, "V2_GEMV_MAX_COUNT"): 2}),
    "split1_m32": (moe_mxfp4.moe_mxfp4_grouped_v2, {
        (moe_mxfp4, "V2_GEMV_MAX_COUNT"): 1, (moe_mxfp4, "V2_GEMV_M_PROGRAMS"): 32}),
    # a row of programs for each expert that could be small (session 35's first version)
    "split1_rows": (moe_mxfp4.moe_mxfp4_grouped_v2, {
        (moe_mxfp4, "V2_GEMV_MAX_COUNT"): 1, (moe_mxfp4, "V2_GEMV_M_PROGRAMS"): 0}),
}  # fmt: skip
PRICED = ("v2", "grouped_gemv")  # the paths split_estimate prices experts by


def even_calls(per_expert: int, calls: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, router_logits) with every expert routed exactly `per_expert` tokens: token t to experts
    4t .. 4t + 3 (mod 128), the first the strongest. Call c shifts the experts by c so that
    back-to-back calls do not share a token's expert set."""
    tokens = EXPERTS * per_expert // TOP_K
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    inputs = []
    for call in range(calls):
        x = torch.randn(tokens, HIDDEN, generator=g, device=DEVICE).to(DTYPE)
        logits = torch.zeros(tokens, EXPERTS, device=DEVICE)
        first = (TOP_K * torch.arange(tokens, device=DEVICE) + call) % EXPERTS
        for slot in range(TOP_K):
            logits[torch.arange(tokens), (first + slot) % EXPERTS] = 8.0 - slot
        inputs.append((x, logits.to(DTYPE)))
    return inputs


def counts_per_expert(logits: torch.Tensor) -> list[int]:
    """Tokens each busy expert holds under `logits`' top-k routing."""
    ids = torch.topk(logits.float(), TOP_K, dim=-1).indices.flatten()
    counts = torch.bincount(ids, minlength=logits.shape[1])
    return [int(c) for c in counts if c > 0]


def time_path(path: str, experts, calls) -> tuple[float, bool, float]:
    fn, switches = PATHS[path]

    def call(x, logits):
        return fn(x, logits, experts, TOP_K, LIMIT, ALPHA)

    defaults = {key: getattr(*key) for key in switches}
    for (module, name), value in switches.items():  # the graph keeps the kernels it captured
        setattr(module, name, value)
    try:
        ok, err = check(call, experts, *calls[0])
        seconds = graph_seconds_per_call([lambda x=x, lg=lg: call(x, lg) for x, lg in calls])
    finally:
        for (module, name), value in defaults.items():
            setattr(module, name, value)
    return seconds, ok, err


def split_estimate(rows: list[dict], random_logits: list[torch.Tensor]) -> dict:
    """C=64's routings priced per busy expert from the even runs' medians: v2 alone, and each
    expert on the cheaper path (a count priced at the largest measured count up to it, or at
    the smallest measured: with gaps, e.g. 1 and 3 measured, two-pair experts get one-pair
    prices, which flatter the GEMV)."""
    cost = collections.defaultdict(dict)  # path -> n -> us a busy expert
    for path in PRICED:
        for n in sorted({r["per_expert"] for r in rows if r["per_expert"]}):
            times = [r["us"] for r in rows if r["path"] == path and r["per_expert"] == n]
            cost[path][n] = statistics.median(times) / EXPERTS

    def price(path: str, n: int) -> float:  # at the largest measured count up to n
        measured = sorted(cost[path])
        return cost[path][max([k for k in measured if k <= n], default=measured[0])]

    v2_only, split = [], []
    for logits in random_logits:
        counts = counts_per_expert(logits)
        v2_only.append(sum(price("v2", n) for n in counts))
        split.append(sum(min(price("v2", n), price("grouped_gemv", n)) for n in counts))
    return {"v2_us": statistics.mean(v2_only), "split_us": statistics.mean(split),
            "cost_us_per_expert": {p: dict(c) for p, c in cost.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-expert", default="1,2,3,4")
    parser.add_argument("--random-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bandwidth, experts = ab_setup()
    cases = [(n, even_calls(n, calls_per_graph(32 * n), seed=n))
             for n in (int(v) for v in args.per_expert.split(","))]  # fmt: skip
    random_calls = make_calls(args.random_tokens, calls_per_graph(args.random_tokens), seed=64)
    cases.append((0, random_calls))  # per_expert 0: C=64's random routings
    rows = []
    for _ in range(args.rounds):
        for n, calls in cases:
            for path in PATHS:
                seconds, ok, err = time_path(path, experts, calls)
                rows.append({"path": path, "per_expert": n, "tokens": calls[0][0].shape[0],
                             "us": seconds * 1e6, "ok": ok, "rel_err": err})  # fmt: skip
                label = f"{n} a busy expert" if n else f"random T={args.random_tokens}"
                print(f"{label:18s} {path:13s} {seconds * 1e6:8.1f} us  ok={ok} err={err:.1e}",
                      flush=True)  # fmt: skip
    print("median us a layer (and a busy expert):")
    for n, _ in cases:
        for path in PATHS:
            us = statistics.median(
                r["us"] for r in rows if r["path"] == path and r["per_expert"] == n
            )
            each = f"  {us / EXPERTS:6.2f} a busy expert" if n else ""
            print(f"  n={n} {path:13s} {us:8.1f}{each}")
    estimate = split_estimate(rows, [logits for _, logits in random_calls])
    print(
        f"random T={args.random_tokens} priced per expert: v2 {estimate['v2_us']:.1f} us, "
        f"split {estimate['split_us']:.1f} us ({100 * (estimate['split_us'] / estimate['v2_us'] - 1):+.1f}%)"
    )
    path = args.json or os.path.join(os.environ.get("OUT", "."), "tokens_per_expert_ab.json")
    write_rows(path, rows, bandwidth, split_estimate=estimate)


if __name__ == "__main__":
    main()
