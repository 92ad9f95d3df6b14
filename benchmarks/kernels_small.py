"""The small decode kernels on gpt-oss-120b shapes, beside their byte floors and the torch/cuBLAS
alternatives: fused RMSNorm, fused rope + KV write, small-M GEMV, GPU sampling.

    python benchmarks/kernels_small.py         # prints tables; writes $OUT/kernels_small.json

Timing is done the way the model runs these ops: `copies` calls on different buffers captured back to
back in one CUDA graph (so weights come from HBM, not from the L2, and there is no Python between
launches), replayed; time per call = replay time / copies. The floor of a row is the bytes it must
move over the device-to-device copy bandwidth measured in the same run.

The GEMV table prints ours (default configs) against cuBLAS (torch.nn.functional.linear) for
M = 1..16 rows: set gossamer/kernels/gemv.py:GEMV_MAX_M to the crossover it suggests. The configs
themselves are swept by benchmarks/gemv_sweep.py.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from timing import copy_bandwidth, graph_seconds_per_call, median_seconds

from gossamer.kernels import gemv, norm, rope, sampling
from gossamer.ops.torch_ref import TorchOps

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2880, 64, 8, 64, 201088
DTYPE = torch.bfloat16
MIN_BYTES_PER_GRAPH = 512 << 20  # enough distinct data per replay to keep the 60 MB L2 out of it

# (name, out_features, in_features, has bias): the dense projections of a gpt-oss decode step
GEMV_SHAPES = [
    ("qkv", 5120, HIDDEN, True),
    ("o_proj", HIDDEN, 4096, True),
    ("router_120b", 128, HIDDEN, True),
    ("router_20b", 32, HIDDEN, True),
    ("unembedding", VOCAB, HIDDEN, False),
]
GEMV_ROWS = (1, 2, 4, 8, 16)


@dataclass
class Row:
    kernel: str
    case: str
    us: float
    floor_us: float
    bytes: float
    baseline: str = ""
    baseline_us: float = 0.0

    def line(self) -> str:
        pct = 100 * self.floor_us / self.us if self.us else 0.0
        tb_s = self.bytes / self.us / 1e6 if self.us else 0.0
        base = ""
        if self.baseline_us:
            speedup = self.baseline_us / self.us
            base = f"{self.baseline:>10s} {self.baseline_us:9.2f} {speedup:6.2f}x"
        return (
            f"{self.kernel:14s} {self.case:26s} {self.us:9.2f} {self.floor_us:9.2f} {pct:5.0f}% "
            f"{tb_s:6.2f} {base}"
        )


HEADER = (
    f"{'kernel':14s} {'case':26s} {'us':>9s} {'floor_us':>9s} {'%floor':>6s} {'TB/s':>6s} "
    f"{'baseline':>10s} {'base_us':>9s} {'speedup':>7s}"
)


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------


def graph_us(calls: list[Callable[[], object]], repeats: int = 15) -> float:
    """Median microseconds of one call when `calls` run back to back in one CUDA graph."""
    return 1e6 * graph_seconds_per_call(calls, repeats)


def eager_us_per_call(calls: list[Callable[[], object]], repeats: int = 10) -> float:
    """For ops that cannot be captured (host syncs): back-to-back eager calls."""

    def run_all() -> None:
        for call in calls:
            call()

    return 1e6 * median_seconds(run_all, repeats) / len(calls)


def copies_for(bytes_per_call: float, max_copies: int = 64) -> int:
    """Calls per graph: enough distinct buffers to exceed the L2, within a launch budget."""
    return max(4, min(max_copies, math.ceil(MIN_BYTES_PER_GRAPH / max(bytes_per_call, 1))))


# ------------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------------


def bench_norm(bandwidth: float) -> list[Row]:
    rows = []
    for tokens in (1, 64, 4096):
        nbytes = tokens * HIDDEN * 2 * 4 + HIDDEN * 4  # read x, residual; write normed, residual
        copies = copies_for(nbytes)
        xs = [torch.randn(tokens, HIDDEN, device="cuda", dtype=DTYPE) for _ in range(copies)]
        residuals = [torch.randn_like(x) for x in xs]
        weight = torch.rand(HIDDEN, device="cuda") + 0.5
        pairs = list(zip(xs, residuals, strict=True))
        ours = graph_us([functools.partial(norm.rms_norm, x, weight, 1e-5, r)
                                  for x, r in pairs])  # fmt: skip
        ref = graph_us([functools.partial(TorchOps().rms_norm, x, weight, 1e-5, r)
                                 for x, r in pairs])  # fmt: skip
        rows.append(Row("rms_norm+add", f"T={tokens}", ours, 1e6 * nbytes / bandwidth, nbytes,
                        "torch", ref))  # fmt: skip
    return rows


def bench_rope_kv(bandwidth: float) -> list[Row]:
    rows = []
    width = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    cos_sin = torch.randn(8192, HEAD_DIM, device="cuda")
    for tokens in (1, 64, 4096):
        # read q, k, v, cos/sin, position, slot; write rotated q and the cache's k and v
        nbytes = tokens * (width * 2 + HEAD_DIM * 4 + 16 + Q_HEADS * HEAD_DIM * 2)
        nbytes += tokens * 2 * KV_HEADS * HEAD_DIM * 2
        copies = copies_for(nbytes)
        qkvs = [torch.randn(tokens, width, device="cuda", dtype=DTYPE) for _ in range(copies)]
        cache = torch.zeros(2, tokens // 16 + 1, 16, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        positions = torch.randint(0, 8192, (tokens,), device="cuda")
        slots = torch.randperm(cache.shape[1] * 16, device="cuda")[:tokens]

        views = [_split_qkv(qkv) for qkv in qkvs]
        tail = (positions, cos_sin, cache, slots)
        ours = graph_us([functools.partial(rope.rope_and_write_kv, *t, *tail)
                                  for t in views])  # fmt: skip
        # the unfused torch path (rope, then a masked scatter that syncs: timed eagerly)
        ref = eager_us_per_call([functools.partial(TorchOps().rope_and_write_kv, *t, *tail)
                                 for t in views])  # fmt: skip
        rows.append(Row("rope+kv_write", f"T={tokens}", ours, 1e6 * nbytes / bandwidth, nbytes,
                        "torch", ref))  # fmt: skip
    return rows


def _split_qkv(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's strided q, k, v views of one fused QKV output [T, (Hq + 2 Hkv) D]."""
    tokens = qkv.shape[0]
    q, k, v = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    return (q.view(tokens, Q_HEADS, HEAD_DIM), k.view(tokens, KV_HEADS, HEAD_DIM),
            v.view(tokens, KV_HEADS, HEAD_DIM))  # fmt: skip


def gemv_bytes(m: int, n: int, k: int, bias: bool) -> float:
    return 2 * (n * k + m * k + m * n + (n if bias else 0))


def make_weights(n: int, k: int, bias: bool, copies: int):
    ws = [torch.randn(n, k, device="cuda", dtype=DTYPE) / k**0.5 for _ in range(copies)]
    bs = [torch.randn(n, device="cuda", dtype=DTYPE) if bias else None for _ in range(copies)]
    return ws, bs


def bench_gemv(bandwidth: float) -> tuple[list[Row], dict]:
    rows, faster = [], {}
    for name, n, k, has_bias in GEMV_SHAPES:
        copies = copies_for(n * k * 2, max_copies=512)  # 512 router copies: 377 MB
        ws, bs = make_weights(n, k, has_bias, copies)
        for m in GEMV_ROWS:
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            nbytes = gemv_bytes(m, n, k, has_bias)
            weights = list(zip(ws, bs, strict=True))
            ours = graph_us([functools.partial(gemv.gemv, x, w, b) for w, b in weights])
            cublas = graph_us([functools.partial(F.linear, x, w, b) for w, b in weights])
            faster[(name, m)] = ours <= cublas
            rows.append(Row("gemv", f"{name} M={m}", ours, 1e6 * nbytes / bandwidth, nbytes,
                            "cuBLAS", cublas))  # fmt: skip
        del ws, bs
    return rows, faster


def suggested_max_m(faster: dict) -> int:
    """The largest M such that ours is at least as fast as cuBLAS for all M' <= M on every shape
    that gemv.linear would send to Triton (the unembedding stays on cuBLAS)."""
    routed = [
        name for name, n, k, _ in GEMV_SHAPES if gemv.shape_class(n, k) in gemv.TRITON_CLASSES
    ]
    best = 0
    for m in GEMV_ROWS:
        if not all(faster[(name, m)] for name in routed):
            break
        best = m
    return best


def bench_sampling(bandwidth: float) -> list[Row]:
    rows = []
    for batch in (1, 8, 64):
        nbytes = batch * VOCAB * 4  # one read of the float32 logits
        copies = max(4, min(16, copies_for(nbytes)))
        logits = [4 * torch.randn(batch, VOCAB, device="cuda") for _ in range(copies)]
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64)
        steps = torch.zeros(batch, device="cuda", dtype=torch.int64)
        cases = {
            "greedy": dict(temperature=torch.zeros(batch, device="cuda")),
            "temperature": dict(temperature=torch.ones(batch, device="cuda")),
            "top_p=0.9": dict(temperature=torch.ones(batch, device="cuda"),
                              top_p=torch.full((batch,), 0.9, device="cuda")),
            "top_k=50+top_p": dict(temperature=torch.ones(batch, device="cuda"),
                                   top_k=torch.full((batch,), 50, device="cuda"),
                                   top_p=torch.full((batch,), 0.9, device="cuda")),
        }  # fmt: skip
        argmax = graph_us([lambda lg=lg: lg.argmax(-1) for lg in logits])
        for case, params in cases.items():
            calls = [functools.partial(sampling.sample, lg, seeds=seeds, steps=steps, **params)
                     for lg in logits]  # fmt: skip
            us = graph_us(calls)
            rows.append(Row("sample", f"N={batch} {case}", us, 1e6 * nbytes / bandwidth, nbytes,
                            "argmax", argmax))  # fmt: skip
    return rows


def main() -> None:
    torch.manual_seed(0)
    begin = time.time()
    bandwidth = copy_bandwidth()
    rows = bench_norm(bandwidth) + bench_rope_kv(bandwidth)
    gemv_rows, faster = bench_gemv(bandwidth)
    rows += gemv_rows + bench_sampling(bandwidth)
    device = torch.cuda.get_device_name()
    print(f"# {device}, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(HEADER)
    for row in rows:
        print(row.line())
    max_m = suggested_max_m(faster)
    print(f"# suggested GEMV_MAX_M = {max_m} (current {gemv.GEMV_MAX_M}); "
          f"{time.time() - begin:.0f} s")  # fmt: skip
    out_dir = os.environ.get("OUT")
    if out_dir:
        result = dict(
            device=device,
            torch=torch.__version__,
            triton=triton.__version__,
            python=platform.python_version(),
            date=time.strftime("%Y-%m-%d"),
            copy_bandwidth=bandwidth,
            suggested_gemv_max_m=max_m,
            rows=[asdict(row) for row in rows],
        )
        path = Path(out_dir) / "kernels_small.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"# wrote {path}")


if __name__ == "__main__":
    main()
