"""A/B of the batch-1 decode fusions on one loaded model, interleaved to cancel drift.

    python benchmarks/fusion_ab.py [--models gpt-oss-120b] [--rounds 2] [--json PATH]

Variants (each a fresh ModelRunner with its start-up warm-up and CUDA graph; the weights load once):
  defaults     MXFP4 repacked for the fp16 GEMV (model/mxfp4.py LAYOUT_FP16_LANES), RoPE + KV
               write inside attention (attention.FUSE_ROPE_KV), the RMSNorms as their own launches
  norm_folded  the defaults with the RMSNorm in the GEMV prologue (gemv.FUSED_NORM_MAX_M)
  no_rope      RoPE + KV write as its own launch
  no_layout    the published MXFP4 bit layout (the experts are repacked back in place)
  none         all three off
  router_split the router + routing launch without the norm in it (the norm kernel first)
  no_router    the norm, the router GEMV and the routing as three launches (moe_mxfp4.FUSED_ROUTER off)
  down_ahead0/2 the batch-1 MoE down GEMV without / with its scales and activation words loaded
               a step early (moe_mxfp4.DECODE_FP16_DOWN's AHEAD; the default 2; gate_up has none)
  late_kv      decode attention loads its first key tile after the PDL wait (attention.EARLY_KV off)
  no_prefetch  decode attention's key loop without loading each tile an iteration ahead
               (attention.PREFETCH_NEXT_KV, on by default since the ninth session)
  split_128    at least 128 keys per split (attention.DECODE_MIN_SPLIT_KEYS, default 64): fewer
               splits to merge, each of two or more tiles that the prefetch overlaps
  sliding_whole sliding-window layers in one split of the whole window, no merge
               (attention.SLIDING_WHOLE_WINDOW)
Each variant is timed `--rounds` times in the order of VARIANTS; the
table gives the median ms per step, tok/s and the byte floor (decode_speed.step_bytes over the
copy bandwidth measured here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time

import torch
import triton
from decode_speed import BLOCK, make_seqs, step_bytes, timed_decode, timed_decode_fed
from timing import copy_bandwidth

from gossamer.kernels import attention, gemv, moe_mxfp4
from gossamer.model import mxfp4
from gossamer.model.loader import load_model
from gossamer.model.weights import set_experts_layout
from gossamer.runner.model_runner import ModelRunner

# In this order, so that the experts are repacked twice per round (each repack of 120b's 57 GB of
# blocks takes a few seconds).
VARIANTS = {
    "defaults": {},
    "norm_folded": {"fused_norm_max_m": gemv.GEMV_MAX_M},
    "no_rope": {"fuse_rope": False},
    "no_layout": {"layout": mxfp4.LAYOUT_HF},
    "none": {"layout": mxfp4.LAYOUT_HF, "fused_norm_max_m": 0, "fuse_rope": False},
    "router_split": {"router_norm": False},
    "no_router": {"fused_router": False},
    # AHEAD of the batch-1 MoE down GEMV: 2 loads each step's scales and activation words a step
    # early (the default), 0 does not
    "down_ahead0": {"down_ahead": 0},
    "down_ahead2": {"down_ahead": 2},
    "late_kv": {"early_kv": False},
    "no_prefetch": {"prefetch_next": False},
    "split_128": {"min_split_keys": 128},
    "sliding_whole": {"sliding_whole": True},
}


def apply(model, variant: dict, defaults: dict) -> None:
    set_experts_layout(model, variant.get("layout", mxfp4.LAYOUT_FP16_LANES))
    gemv.FUSED_NORM_MAX_M = variant.get("fused_norm_max_m", defaults["fused_norm_max_m"])
    attention.FUSE_ROPE_KV = variant.get("fuse_rope", defaults["fuse_rope"])
    attention.EARLY_KV = variant.get("early_kv", defaults["early_kv"])
    attention.PREFETCH_NEXT_KV = variant.get("prefetch_next", defaults["prefetch_next"])
    attention.DECODE_MIN_SPLIT_KEYS = variant.get("min_split_keys", defaults["min_split_keys"])
    attention.SLIDING_WHOLE_WINDOW = variant.get("sliding_whole", defaults["sliding_whole"])
    moe_mxfp4.FUSED_ROUTER = variant.get("fused_router", defaults["fused_router"])
    moe_mxfp4.ROUTER_NORM = variant.get("router_norm", defaults["router_norm"])
    down_ahead = variant.get("down_ahead", defaults["down_ahead"])
    moe_mxfp4.DECODE_FP16_DOWN = defaults["down"] | {"AHEAD": down_ahead}


def time_variant(model, context: int, steps: int) -> float:
    runner, seqs = make_runner(model, context, steps)
    seconds = timed_decode(runner, seqs, steps)
    del runner
    torch.cuda.empty_cache()
    return seconds


def make_runner(model, context: int, tokens: int):
    """A batch-1 runner with its graph (captured under the module switches as they are now) and a
    sequence at `context` with room for `tokens` more."""
    runner = ModelRunner(
        model,
        num_blocks=2 + 2 * math.ceil((context + tokens + 16) / BLOCK),
        block_size=BLOCK,
        max_num_seqs=1,
        max_num_batched_tokens=max(1, 16),
        cuda_graphs=True,
        graph_sizes=(1,),
        warmup=True,
    )
    runner.kv_cache.normal_(0, 0.5)
    return runner, make_seqs(1, context, math.ceil((context + tokens + 16) / BLOCK))


def interleaved_times(model, chosen: list[str], defaults: dict, args) -> dict[str, list[float]]:
    """Every variant's runner built first, then timed in turn, `rounds` times: slow drift of the
    machine (clocks, other tenants) then hits every variant alike. Variants that repack the
    experts cannot share the weights this way."""
    if any("layout" in VARIANTS[v] for v in chosen):
        raise SystemExit("--interleave cannot run variants that repack the experts")
    runners = {}
    for variant in chosen:
        apply(model, VARIANTS[variant], defaults)
        runners[variant] = make_runner(model, args.context, args.rounds * (args.steps + 3))
    apply(model, {}, defaults)
    times = {v: [] for v in chosen}
    for _ in range(args.rounds):
        for variant, (runner, seqs) in runners.items():
            timer = timed_decode_fed if args.fed else timed_decode
            times[variant].append(timer(runner, seqs, args.steps))
    print(" ".join(f"{v} {1e3 * statistics.median(t):.3f}" for v, t in times.items()), flush=True)
    return times


def bench(name: str, args: argparse.Namespace, bandwidth: float) -> list[dict]:
    grown = args.rounds * (args.steps + 3) if args.interleave else args.steps  # tokens decoded
    loaded = load_model(
        name, load_format="dummy", device="cuda", max_model_len=args.context + grown + 32
    )
    model, cfg = loaded.model, loaded.config
    defaults = {"fused_norm_max_m": gemv.FUSED_NORM_MAX_M, "fuse_rope": attention.FUSE_ROPE_KV,
                "fused_router": moe_mxfp4.FUSED_ROUTER, "router_norm": moe_mxfp4.ROUTER_NORM,
                "early_kv": attention.EARLY_KV, "prefetch_next": attention.PREFETCH_NEXT_KV,
                "min_split_keys": attention.DECODE_MIN_SPLIT_KEYS,
                "sliding_whole": attention.SLIDING_WHOLE_WINDOW,
                "down": moe_mxfp4.DECODE_FP16_DOWN,
                "down_ahead": moe_mxfp4.DECODE_FP16_DOWN.get("AHEAD", 0)}  # fmt: skip
    chosen = args.variants.split(",") if args.variants else list(VARIANTS)
    if args.interleave:
        times = interleaved_times(model, chosen, defaults, args)
    else:
        times = sequential_times(model, chosen, defaults, args)
    apply(model, {}, defaults)
    floor = step_bytes(cfg, 1, args.context + args.steps // 2) / bandwidth
    rows = []
    for variant, seconds in times.items():
        median = statistics.median(seconds)
        rows.append({"model": name, "variant": variant, "ms": 1e3 * median,
                     "tok_s": 1 / median, "floor_ms": 1e3 * floor,
                     "runs_ms": [1e3 * s for s in seconds]})  # fmt: skip
    del model, loaded
    torch.cuda.empty_cache()
    return rows


def sequential_times(model, chosen: list[str], defaults: dict, args) -> dict[str, list[float]]:
    """Each variant's runner built, timed and dropped in turn, `rounds` times."""
    times = {v: [] for v in chosen}
    for _ in range(args.rounds):
        for variant in chosen:
            apply(model, VARIANTS[variant], defaults)
            seconds = time_variant(model, args.context, args.steps)
            times[variant].append(seconds)
            print(f"{variant:10s} {1e3 * seconds:7.3f} ms", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="gpt-oss-120b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--variants", default=None, help=f"comma-separated, of {list(VARIANTS)}")
    parser.add_argument(
        "--fed",
        action="store_true",
        help="with --interleave: tokens fed on the device (decode_speed's fed rows)",
    )
    parser.add_argument("--interleave", action="store_true",
                        help="build every variant's runner first, then time them in turn")  # fmt: skip
    args = parser.parse_args()
    bandwidth = copy_bandwidth(gib=4)
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows = []
    for name in args.models.split(","):
        rows += bench(name, args, bandwidth)
    print("model         variant      ms/step    tok/s  floor_ms")
    for r in rows:
        print(f"{r['model']:13s} {r['variant']:10s} {r['ms']:8.3f} {r['tok_s']:8.1f} "
              f"{r['floor_ms']:8.3f}")  # fmt: skip
    result = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "copy_bandwidth_bytes_s": bandwidth,
              "args": vars(args), "rows": rows}  # fmt: skip
    path = args.json or (
        os.path.join(os.environ["OUT"], "fusion_ab.json") if "OUT" in os.environ else None
    )
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
