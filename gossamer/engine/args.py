"""Command-line flags of the engine (shared by `serve` and the benchmarks)."""

from __future__ import annotations

import argparse

from gossamer.engine.core import KV_CACHE_DTYPES, EngineConfig
from gossamer.spec.config import add_spec_arguments, spec_config_from_args


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--kv-cache-memory",
        type=_bytes,
        default=None,
        help="KV cache size, e.g. 8GiB (default: what --gpu-memory-utilization leaves; 1 GiB on CPU)",
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument(
        "--kv-cache-dtype",
        choices=["auto", *KV_CACHE_DTYPES],
        default="auto",
        help="auto: the model's dtype; fp8: float8 e4m3 keys and values (scale 1), twice the "
        "tokens per GiB and half the KV reads, at some accuracy",
    )
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="run decode eagerly")
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the start-up kernel warm-up (new step shapes then compile during requests)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of unseeded sampling")
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlap plain decode steps: launch the next step before the host has this one's "
        "tokens, hiding the engine's host time per step (gossamer/engine/overlap.py; on the H200, "
        "gpt-oss-20b at one request: 1.66 ms per token against 2.23 synchronous). "
        "--no-async-scheduling runs every step synchronously",
    )
    add_spec_arguments(parser)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        cuda_graphs=not args.no_cuda_graphs,
        warmup=not args.no_warmup,
        seed=args.seed,
        speculative_config=spec_config_from_args(args),
        async_scheduling=args.async_scheduling,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def _bytes(text: str) -> int:
    """'8GiB', '512MiB', '1e9' -> bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1e3, "mb": 1e6, "gb": 1e9}
    lowered = text.strip().lower()
    for suffix, scale in units.items():
        if lowered.endswith(suffix):
            return int(float(lowered[: -len(suffix)]) * scale)
    return int(float(lowered))
