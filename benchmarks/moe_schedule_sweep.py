"""The MoE's small launches around the expert kernels: the expert schedule and the slot sum.

    python benchmarks/moe_schedule_sweep.py [--pairs 4,32,128,256,1024] [--json F]

At batch 64 of gpt-oss-120b (step_profile.py, session 22, H100) the one-launch expert schedule
took 11.7 us a layer and v2's torch slot sum 5.3 + 1.5 us (sum, then the cast): 0.67 ms a step,
for kernels that move a few KB. This times, in a CUDA graph of 32 back-to-back launches (latency
as the decode graph sees it):
- `expert_schedule` (moe_grouped_gemv) at each pair count (ids of 128 experts, block_m as v2 picks
  it), its one-hot placement at CHUNK x warps, and its sort placement (_schedule_sort_kernel);
- the slot sum of top-4 fp32 rows into bf16 at 64 and 256 tokens of 2880: torch's sum + cast
  against `slot_sum`.
The schedule's variants are checked against moe_mxfp4._expert_schedule (`ok`).
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton
from timing import graph_seconds_per_call

from gossamer.kernels import moe_grouped_gemv as gemv
from gossamer.kernels import moe_mxfp4

NUM_EXPERTS, TOP_K, HIDDEN = 128, 4, 2880


def time_schedule(num_pairs: int, chunk: int, warps: int, sort: bool) -> tuple[float, bool]:
    ids = torch.randint(0, NUM_EXPERTS, (num_pairs,), dtype=torch.int32, device="cuda")
    block_m = moe_mxfp4._v2_block_m(num_pairs, NUM_EXPERTS)
    saved = gemv._SCHEDULE_CHUNK, gemv.SCHEDULE_WARPS, gemv.SCHEDULE_SORT_MAX_PAIRS
    gemv._SCHEDULE_CHUNK, gemv.SCHEDULE_WARPS = chunk, warps
    gemv.SCHEDULE_SORT_MAX_PAIRS = gemv.SCHEDULE_MAX_PAIRS if sort else 0
    try:
        got = gemv.expert_schedule(ids, NUM_EXPERTS, block_m)
        expected = moe_mxfp4._expert_schedule(ids, NUM_EXPERTS, block_m)
        ok = all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        seconds = graph_seconds_per_call(
            [lambda: gemv.expert_schedule(ids, NUM_EXPERTS, block_m)] * 32, repeats=20
        )
    finally:
        gemv._SCHEDULE_CHUNK, gemv.SCHEDULE_WARPS, gemv.SCHEDULE_SORT_MAX_PAIRS = saved
    return seconds, ok


def time_slot_sum(num_tokens: int) -> dict:
    y = torch.randn(num_tokens * TOP_K, HIDDEN, device="cuda")
    out = torch.empty(num_tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")

    def torch_sum():
        return y.view(num_tokens, TOP_K, HIDDEN).sum(dim=1).to(torch.bfloat16)

    gemv.slot_sum(y, out, TOP_K)
    ok = bool(torch.allclose(out.float(), torch_sum().float(), atol=1e-2, rtol=1e-2))
    torch_s = graph_seconds_per_call([torch_sum] * 32, repeats=20)
    triton_s = graph_seconds_per_call([lambda: gemv.slot_sum(y, out, TOP_K)] * 32, repeats=20)
    return {
        "tokens": num_tokens,
        "torch_us": torch_s * 1e6,
        "slot_sum_us": triton_s * 1e6,
        "ok": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", default="4,32,128,256,1024")
    parser.add_argument("--chunks", default="32,64,128")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    rows = []
    for num_pairs in (int(p) for p in args.pairs.split(",")):
        variants = [("one-hot", int(c), int(w)) for c in args.chunks.split(",")
                    for w in args.warps.split(",")]  # fmt: skip
        variants += [("sort", 64, int(w)) for w in args.warps.split(",")]
        for name, chunk, warps in variants:
            seconds, ok = time_schedule(num_pairs, chunk, warps, name == "sort")
            row = {"pairs": num_pairs, "variant": name, "chunk": chunk, "warps": warps,
                   "us": seconds * 1e6, "ok": ok}  # fmt: skip
            print(f"schedule pairs {num_pairs:5d} {name:8s} chunk {chunk:4d} warps {warps:2d} "
                  f"{row['us']:7.2f} us {'ok' if ok else 'MISMATCH'}", flush=True)  # fmt: skip
            rows.append(row)
    sums = []
    for num_tokens in (64, 256):
        row = time_slot_sum(num_tokens)
        print(f"slot sum {num_tokens:4d} tokens: torch sum + cast {row['torch_us']:6.2f} us, "
              f"slot_sum {row['slot_sum_us']:6.2f} us {'ok' if row['ok'] else 'MISMATCH'}")  # fmt: skip
        sums.append(row)
    if args.json:
        result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "triton": triton.__version__, "python": platform.python_version(),
                  "schedule": rows, "slot_sum": sums}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
