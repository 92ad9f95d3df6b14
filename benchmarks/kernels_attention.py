"""Triton paged attention (gossamer/kernels/attention.py) on gpt-oss-120b shapes, beside its byte floor.

    python benchmarks/kernels_attention.py          # prints a table; writes $OUT/kernels_attention.json
    python benchmarks/kernels_attention.py --min-split-keys 64,128,256,512 [--graph-max-len 131072]
    python benchmarks/kernels_attention.py --sweep-batch --batch-sizes 64 --contexts 1024,2048 \
        --num-splits auto,1,2,4,8 --block-n 32,64 --warps 2,4 --stages 2,3

The second form sweeps the decode launch's keys-per-split minimum (attention.DECODE_MIN_SPLIT_KEYS)
at batch 1 and 8 (1k and 8k context, full and sliding layers); --graph-max-len launches as a graph
captured for that context would (max_seq_len = it; the real lengths stay 1k / 8k), as the engine's
decode graphs do. The third sweeps the decode launch itself (key splits, keys per iteration, warps,
pipeline stages; "auto" keeps the heuristic) at larger batches, full and sliding layers.

Decode rows: batch 1 and 64 at 1k and 8k context, full and sliding (window 128) layers. Each row is
timed like the model runs it: one CUDA graph holding the op on `layers` different layer caches (so
the KV comes from HBM, not from the 60 MB L2), replayed; time per layer call = replay time / layers.
The floor is the bytes one call must move (the visible K and V, q and the output) over the
device-to-device copy bandwidth measured in the same run. Every row is also checked once against the
torch reference (`ok` column). Prefill rows: one 1k-token prompt, and a 1k chunk after a 7k prefix.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from timing import copy_bandwidth, graph_seconds_per_call

from gossamer.kernels import attention as kernels
from gossamer.ops.base import AttentionMetadata
from gossamer.ops.torch_ref import TorchOps

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, WINDOW = 64, 8, 64, 16, 128
DTYPE = torch.bfloat16
L2_BYTES = 60 << 20


@dataclass
class Row:
    kind: str  # decode | prefill | write_kv
    layer: str  # full | sliding
    batch: int
    context: int
    query_len: int
    us: float  # per call, median
    floor_us: float
    bytes: float
    tflops: float
    ok: bool | None
    min_split_keys: int | None = None  # the decode launch's override (sweep rows)
    launch_max_len: int | None = None  # max_seq_len the launch was sized for, if not the context
    launch: str | None = None  # the batch sweep's launch overrides (splits, block_n, warps, stages)

    def line(self) -> str:
        pct = 100 * self.floor_us / self.us if self.us else 0.0
        tb_s = self.bytes / self.us / 1e6 if self.us else 0.0
        ok = {True: "ok", False: "MISMATCH", None: "-"}[self.ok]
        sweep = ""
        if self.min_split_keys is not None:
            sweep = f" min_split_keys={self.min_split_keys} launch_max_len={self.launch_max_len}"
        if self.launch is not None:
            sweep += f" {self.launch}"
        return (
            f"{self.kind:8s} {self.layer:7s} {self.batch:5d} {self.context:6d} {self.query_len:5d} "
            f"{self.us:9.1f} {self.floor_us:9.1f} {pct:5.0f}% {tb_s:6.2f} {self.tflops:7.1f} {ok}"
            f"{sweep}"
        )


HEADER = (
    f"{'kind':8s} {'layer':7s} {'batch':>5s} {'ctx':>6s} {'q':>5s} {'us':>9s} {'floor_us':>9s} "
    f"{'%floor':>6s} {'TB/s':>6s} {'TFLOP/s':>7s} check"
)


def make_inputs(seqs: list[tuple[int, int]], window: int | None, num_layers: int, seed: int = 0):
    """q, a [layers, 2, blocks, block_size, Hkv, D] cache in shuffled blocks, metadata, sinks.
    As in a sliding cache group, blocks that left the window are the null block 0 (not allocated)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    first_blocks = [_first_visible_key(q, s, window) // BLOCK_SIZE for q, s in seqs]
    last_blocks = [math.ceil(seq_len / BLOCK_SIZE) for _, seq_len in seqs]
    num_blocks = 1 + sum(
        last - first for first, last in zip(first_blocks, last_blocks, strict=True)
    )
    shape = (num_layers, 2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    kv_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
    physical = torch.randperm(num_blocks - 1, device="cuda", generator=gen).to(torch.int32) + 1
    block_table = torch.zeros(len(seqs), max(last_blocks), dtype=torch.int32, device="cuda")
    used = 0
    for seq, (first, last) in enumerate(zip(first_blocks, last_blocks, strict=True)):
        block_table[seq, first:last] = physical[used : used + last - first]
        used += last - first
    query_lens = [query_len for query_len, _ in seqs]
    seq_lens = [seq_len for _, seq_len in seqs]
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        slot_mapping=(torch.empty(0, dtype=torch.int64, device="cuda"),) * 2,
        block_tables=(block_table, block_table),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
    )
    q = torch.randn((starts[-1], NUM_Q_HEADS, HEAD_DIM), generator=gen, device="cuda", dtype=DTYPE)
    sinks = torch.randn(NUM_Q_HEADS, generator=gen, device="cuda")
    return q, kv_cache, metadata, sinks


def _first_visible_key(query_len: int, seq_len: int, window: int | None) -> int:
    return 0 if window is None else max(0, seq_len - query_len - window + 1)


def visible_pairs(seqs: list[tuple[int, int]], window: int | None) -> tuple[int, int]:
    """(keys read once per kv head, query-key pairs computed) for the batch."""
    keys = pairs = 0
    for query_len, seq_len in seqs:
        first = seq_len - query_len
        keys += seq_len - _first_visible_key(query_len, seq_len, window)
        for pos in range(first, seq_len):
            pairs += pos + 1 if window is None else min(pos + 1, window)
    return keys, pairs


def bench_attention(
    kind: str,
    seqs: list[tuple[int, int]],
    window: int | None,
    bw: float,
    min_split_keys: int | None = None,
    launch_max_len: int | None = None,
    launch: dict | None = None,
) -> Row:
    """One row. `launch` (batch sweep): num_splits / block_n for paged_attention (None: its
    heuristics) and warps / stages for the decode launch (set on the module while timing)."""
    keys, pairs = visible_pairs(seqs, window)
    num_tokens = sum(query_len for query_len, _ in seqs)
    elem = torch.finfo(DTYPE).bits // 8
    kv_bytes = keys * NUM_KV_HEADS * HEAD_DIM * 2 * elem
    total_bytes = kv_bytes + 2 * num_tokens * NUM_Q_HEADS * HEAD_DIM * elem
    # Enough layer caches that one graph replay reads ~4x the L2, as the model's layers do.
    num_layers = max(2, min(64, math.ceil(4 * L2_BYTES / max(kv_bytes, 1))))
    q, kv_cache, metadata, sinks = make_inputs(seqs, window, num_layers)
    scale = HEAD_DIM**-0.5

    launch = launch or {}

    def one_layer(layer: int) -> torch.Tensor:
        if min_split_keys is None and launch_max_len is None and not launch:
            return kernels.attention(q, kv_cache[layer], metadata, 0, sinks, scale, window)
        return kernels.paged_attention(
            q, kv_cache[layer], metadata.query_start_loc, metadata.seq_lens,
            metadata.block_tables[0], metadata.max_query_len,
            launch_max_len or metadata.max_seq_len, sinks, scale, window,
            min_split_keys=min_split_keys, num_splits=launch.get("splits"),
            block_n=launch.get("block_n"),
        )  # fmt: skip

    defaults = kernels.DECODE_NUM_WARPS, kernels.DECODE_NUM_STAGES
    kernels.DECODE_NUM_WARPS = launch.get("warps") or defaults[0]
    kernels.DECODE_NUM_STAGES = launch.get("stages") or defaults[1]
    try:
        out = one_layer(0)
        expected = TorchOps().attention(q, kv_cache[0], metadata, 0, sinks, scale, window)
        ok = bool(torch.allclose(out.float(), expected.float(), atol=2e-2, rtol=2e-2))
        del expected
        seconds = graph_seconds_per_call(
            [lambda i=i: one_layer(i) for i in range(num_layers)], repeats=20
        )
    finally:
        kernels.DECODE_NUM_WARPS, kernels.DECODE_NUM_STAGES = defaults
    return Row(
        kind=kind,
        layer="full" if window is None else "sliding",
        batch=len(seqs),
        context=max(s for _, s in seqs),
        query_len=max(q for q, _ in seqs),
        us=seconds * 1e6,
        floor_us=total_bytes / bw * 1e6,
        bytes=total_bytes,
        tflops=4 * pairs * NUM_Q_HEADS * HEAD_DIM / seconds / 1e12,
        ok=ok,
        min_split_keys=min_split_keys,
        launch_max_len=launch_max_len,
        launch=" ".join(f"{k}={v}" for k, v in launch.items()) if launch else None,
    )


def bench_write_kv(num_tokens: int, bw: float) -> Row:
    elem = torch.finfo(DTYPE).bits // 8
    num_blocks = 4096
    cache = torch.zeros(
        2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda"
    )
    k, v = torch.randn(2, num_tokens, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device="cuda")[:num_tokens]
    expected = cache.clone()
    TorchOps().write_kv(k, v, expected, slots)
    kernels.write_kv(k, v, cache, slots)
    ok = bool(torch.equal(cache, expected))
    seconds = graph_seconds_per_call(
        [lambda: kernels.write_kv(k, v, cache, slots)] * 20, repeats=20
    )
    moved = 2 * 2 * num_tokens * NUM_KV_HEADS * HEAD_DIM * elem  # k and v, read and written
    return Row("write_kv", "-", num_tokens, 0, 1, seconds * 1e6, moved / bw * 1e6, moved, 0.0, ok)


def sweep_cases(min_split_keys: list[int], launch_max_len: int | None) -> list[tuple]:
    """(kind, seqs, window, min_split_keys, launch_max_len) of the keys-per-split sweep."""
    cases = []
    for batch in (1, 8):
        for context in (1024, 8192):
            for window in (None, WINDOW):
                for keys in min_split_keys:
                    cases.append(("decode", [(1, context)] * batch, window, keys, launch_max_len))
    return cases


def batch_sweep_cases(args) -> list[tuple]:
    """(kind, seqs, window, None, None, launch) of the batch sweep: every combination of the
    listed launch overrides ("auto": the heuristic's own choice) at each batch and context."""

    def values(text: str) -> list[int | None]:
        return [None if v == "auto" else int(v) for v in text.split(",")]

    cases = []
    for batch in values(args.batch_sizes):
        for context in values(args.contexts):
            for window in (None, WINDOW):
                for splits, block_n, warps, stages in itertools.product(
                    values(args.num_splits), values(args.block_n), values(args.warps),
                    values(args.stages),
                ):  # fmt: skip
                    launch = {"splits": splits, "block_n": block_n, "warps": warps,
                              "stages": stages}  # fmt: skip
                    launch = {k: v for k, v in launch.items() if v is not None}
                    cases.append(("decode", [(1, context)] * batch, window, None, None, launch))
    return cases


def default_cases() -> list[tuple]:
    cases = []
    for batch in (1, 64):
        for context in (1024, 8192):
            for window in (None, WINDOW):
                cases.append(("decode", [(1, context)] * batch, window, None, None))
    for window in (None, WINDOW):
        cases.append(("prefill", [(1024, 1024)], window, None, None))
        cases.append(("prefill", [(1024, 8192)], window, None, None))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--min-split-keys",
        default=None,
        help="comma-separated keys-per-split minima to sweep (decode rows only)",
    )
    parser.add_argument(
        "--graph-max-len",
        type=int,
        default=None,
        help="size the sweep's launches for this max_seq_len (engine graphs)",
    )
    parser.add_argument(
        "--sweep-batch",
        action="store_true",
        help="decode launches at --batch-sizes x --contexts, over the launch overrides below",
    )
    parser.add_argument("--batch-sizes", default="64")
    parser.add_argument("--contexts", default="1024,2048")
    parser.add_argument("--num-splits", default="auto", help='e.g. "auto,1,2,4,8"')
    parser.add_argument("--block-n", default="auto", help='keys per iteration, e.g. "32,64,128"')
    parser.add_argument("--warps", default="auto")
    parser.add_argument("--stages", default="auto")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
        f"copy bandwidth {bw / 1e12:.2f} TB/s; Hq={NUM_Q_HEADS} Hkv={NUM_KV_HEADS} D={HEAD_DIM} "
        f"block {BLOCK_SIZE}, window {WINDOW}, {DTYPE}"
    )
    print(HEADER)
    rows: list[Row] = []
    sweep = args.min_split_keys is not None or args.sweep_batch
    if args.sweep_batch:
        cases = batch_sweep_cases(args)
    elif sweep:
        keys = [int(k) for k in args.min_split_keys.split(",")]
        cases = sweep_cases(keys, args.graph_max_len)
    else:
        cases = default_cases()
    for case in cases:
        row = bench_attention(*case[:3], bw, *case[3:])
        print(row.line(), flush=True)
        rows.append(row)
    for num_tokens in () if sweep else (1, 64, 1024):
        row = bench_write_kv(num_tokens, bw)
        print(row.line(), flush=True)
        rows.append(row)
    out_dir = os.environ.get("OUT")
    if out_dir:
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "copy_bandwidth_bytes_per_s": bw,
            "rows": [asdict(row) for row in rows],
        }
        name = "kernels_attention_splits.json" if sweep else "kernels_attention.json"
        if args.sweep_batch:
            name = "kernels_attention_batch.json"
        path = Path(out_dir) / name
        path.write_text(json.dumps(result, indent=2))
        print(f"# wrote {path}")


if __name__ == "__main__":
    main()
