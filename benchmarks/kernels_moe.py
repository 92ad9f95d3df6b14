"""Triton MXFP4 MoE (gossamer/kernels/moe_mxfp4.py) on gpt-oss-120b shapes, beside its byte floor.

    python benchmarks/kernels_moe.py          # prints tables; writes $OUT/kernels_moe.json if OUT is set

One MoE layer: hidden 2880, intermediate 2880, 128 experts, top-4, bf16 activations, random packed
weights. Rows:
  * each path (decode GEMV, grouped GEMM v1 and v2, v2's config variants) at several batch sizes T. Timed like the model runs it: one
    CUDA graph holding `calls` back-to-back layer calls with different routings (at T=1 call c uses
    experts 4c..4c+3, so consecutive calls never share weights and nothing is served from the
    60 MB L2), replayed; time per call = replay time / calls (launch gaps included);
  * a per-kernel breakdown at T=1 (triton.testing.do_bench, L2 flushed before each run);
  * a small sweep of the decode tile configs at T=1 (per kernel, do_bench).
floor_us: the bytes the call must read (packed weights + scales + biases of the distinct experts it
routes to, plus activations in and out) over the device-to-device copy bandwidth measured here.
TB/s: bytes the kernels actually read per second (the GEMV path reads an expert once per (token,
slot), so at T>1 it may read more than the floor's distinct experts). Every path row is checked once
against the torch reference in fp32 (`ok`: norm-wise relative error < 1e-2).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import triton
import triton.testing
from timing import copy_bandwidth, graph_seconds_per_call

from gossamer.kernels import moe_mxfp4 as moe
from gossamer.model import mxfp4
from gossamer.ops.base import ExpertWeights
from gossamer.ops.torch_ref import TorchOps

HIDDEN, INTER, EXPERTS, TOP_K = 2880, 2880, 128, 4
LIMIT, ALPHA = 7.0, 1.702
DTYPE = torch.bfloat16
DEVICE = "cuda"  # a CPU dry run of this script's glue (tiny shapes, interpreter) swaps it

GATE_UP_BYTES = 2 * INTER * (HIDDEN // 2 + HIDDEN // 32 + 2)  # packed + scales + bf16 bias
DOWN_BYTES = HIDDEN * (INTER // 2 + INTER // 32 + 2)
EXPERT_BYTES = GATE_UP_BYTES + DOWN_BYTES


def make_experts(seed: int = 0) -> ExpertWeights:
    """Random packed experts, labelled with the bit layout the loader would give the kernels
    (random bytes are random codes in either layout; the reference reads both)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    e, h, i = EXPERTS, HIDDEN, INTER

    def packed(*shape):
        return torch.randint(0, 256, shape, generator=g, device=DEVICE, dtype=torch.uint8)

    def scales(*shape):
        return torch.randint(119, 122, shape, generator=g, device=DEVICE, dtype=torch.uint8)

    return ExpertWeights(
        gate_up_bias=(0.1 * torch.randn(e, 2 * i, generator=g, device=DEVICE)).to(DTYPE),
        down_bias=(0.1 * torch.randn(e, h, generator=g, device=DEVICE)).to(DTYPE),
        gate_up_blocks=packed(e, 2 * i, h // 32, 16),
        gate_up_scales=scales(e, 2 * i, h // 32),
        down_blocks=packed(e, h, i // 32, 16),
        down_scales=scales(e, h, i // 32),
        layout=mxfp4.gpu_layout(),
    )


def make_calls(tokens: int, calls: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, router_logits) per call. At T=1 call c routes to experts 4c..4c+3 (mod 128)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    inputs = []
    for call in range(calls):
        x = torch.randn(tokens, HIDDEN, generator=g, device=DEVICE).to(DTYPE)
        if tokens == 1:
            logits = torch.zeros(1, EXPERTS, device=DEVICE)
            first = (TOP_K * call) % EXPERTS
            logits[0, first : first + TOP_K] = torch.arange(TOP_K, 0, -1, device=DEVICE) + 4.0
        else:
            logits = torch.randn(tokens, EXPERTS, generator=g, device=DEVICE)
        inputs.append((x, logits.to(DTYPE)))
    return inputs


def floor_bytes(logits: torch.Tensor) -> tuple[int, int]:
    """(bytes of the distinct experts + activations, expert reads of the GEMV path) for one call."""
    tokens = logits.shape[0]
    distinct = torch.topk(logits.float(), TOP_K, dim=-1).indices.unique().numel()
    activations = 2 * tokens * HIDDEN * 2  # x in, out
    return distinct * EXPERT_BYTES + activations, tokens * TOP_K * EXPERT_BYTES + activations


def check(fn, experts: ExpertWeights, x: torch.Tensor, logits: torch.Tensor) -> tuple[bool, float]:
    fp32 = dataclasses.replace(
        experts, gate_up_bias=experts.gate_up_bias.float(), down_bias=experts.down_bias.float()
    )
    expected = TorchOps().moe(x.float(), logits.float(), fp32, TOP_K, LIMIT, ALPHA)
    out = fn(x, logits).float()
    err = ((out - expected).norm() / expected.norm()).item()
    return err < 1e-2 and bool(torch.isfinite(out).all()), err


def calls_per_graph(tokens: int) -> int:
    """Enough calls that one replay reads several times the L2 (T=1: 32 x 53 MB)."""
    return 32 if tokens <= 16 else (8 if tokens <= 64 else 2)


# The grouped v2 kernels with these changes to both configs (the defaults the kernel takes at
# the call's M-tile: moe_mxfp4.v2_configs).
V2_VARIANTS = {
    "grouped_v2": {},
    "grouped_v2_sync_scales": {"SCALE_PREFETCH": 0},
    "grouped_v2_rep2": {"REP": 2},
    "grouped_v2_stages2": {"NUM_STAGES": 2},
}


def path_fn(path: str, experts: ExpertWeights):
    """(x, router_logits) -> MoE output through one path."""
    if path in V2_VARIANTS:
        return lambda x, lg: v2_call(x, lg, experts, V2_VARIANTS[path])
    experts = experts_for(path, experts)
    return {
        "decode": lambda x, lg: moe.moe_mxfp4_decode(x, lg, experts, TOP_K, LIMIT, ALPHA),
        "decode_fp16": lambda x, lg: moe.moe_mxfp4_decode_fp16(x, lg, experts, TOP_K, LIMIT, ALPHA),
        "grouped": lambda x, lg: moe.moe_mxfp4_grouped(x, lg, experts, TOP_K, LIMIT, ALPHA),
    }[path]


def v2_call(x, logits, experts: ExpertWeights, changes: dict):
    """Grouped v2 with `changes` to the configs it would take at this call's M-tile."""
    block_m = moe._v2_block_m(x.shape[0] * TOP_K, logits.shape[1])
    gate_up, down = moe.v2_configs(block_m)
    return moe.moe_mxfp4_grouped_v2(x, logits, experts, TOP_K, LIMIT, ALPHA,
                                    gate_up_config=gate_up | changes, down_config=down | changes)  # fmt: skip


def experts_for(path: str, experts: ExpertWeights) -> ExpertWeights:
    """The older kernels (fp32 GEMV, grouped v1) read only the published layout: the same random
    bytes, labelled so."""
    if path in ("decode", "grouped"):
        return dataclasses.replace(experts, layout=mxfp4.LAYOUT_HF)
    return experts


def bench_path(path: str, tokens: int, experts: ExpertWeights, bw: float) -> dict:
    experts = experts_for(path, experts)
    fn = path_fn(path, experts)
    inputs = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
    ok, err = check(fn, experts, *inputs[0])
    floors = [floor_bytes(logits) for _, logits in inputs]
    floor = statistics.mean(f for f, _ in floors)
    if path.startswith("decode"):
        moved = statistics.mean(m for _, m in floors)
    else:
        moved = floor
    note = ""
    try:
        seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in inputs])
    except Exception as exc:  # noqa: BLE001 -- report and fall back to plain timing
        note = f"graph capture failed ({type(exc).__name__}: {exc}); do_bench instead"
        torch.cuda.synchronize()
        seconds = triton.testing.do_bench(lambda: fn(*inputs[0]), return_mode="median") / 1e3
    return {
        "path": path,
        "tokens": tokens,
        "us": seconds * 1e6,
        "floor_us": floor / bw * 1e6,
        "bytes_floor": floor,
        "bytes_read": moved,
        "tb_s": moved / seconds / 1e12,
        "ok": ok,
        "rel_err": err,
        "note": note,
    }


def bench_kernels_t1(experts: ExpertWeights, bw: float) -> Iterator[dict]:
    """Per-kernel times of the decode path at T=1 and a small sweep of its tile configs."""
    x, logits = make_calls(1, 1, seed=7)[0]
    ids, route_w, x_planes = moe.route(logits, TOP_K, x)
    act = torch.empty(TOP_K, 8, INTER // 8, dtype=torch.float32, device=DEVICE)
    out = torch.empty_like(x)
    words_gu = experts.gate_up_blocks.view(torch.int32)
    words_dn = experts.down_blocks.view(torch.int32)

    def gate_up(cfg):
        moe._decode_gate_up_kernel[(triton.cdiv(INTER, cfg["BLOCK_PAIRS"]), TOP_K)](
            x_planes, ids, words_gu, experts.gate_up_scales, experts.gate_up_bias, act,
            LIMIT, ALPHA, H=HIDDEN, INTER=INTER, TOP_K=TOP_K, PTX=moe._ptx(), **cfg,
        )  # fmt: skip

    def down(cfg):
        moe._decode_down_kernel[(triton.cdiv(HIDDEN, cfg["BLOCK_ROWS"]), 1)](
            act, ids, route_w, words_dn, experts.down_scales, experts.down_bias, out,
            H=HIDDEN, INTER=INTER, TOP_K=TOP_K, K_P2=TOP_K, PTX=moe._ptx(), **cfg,
        )  # fmt: skip

    def timed(name: str, fn, nbytes: float) -> dict:
        us = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3
        return {"kernel": name, "us": us, "floor_us": nbytes / bw * 1e6, "tb_s": nbytes / us / 1e6}

    yield timed("route+x_planes", lambda: moe.route(logits, TOP_K, x), EXPERTS * 2 + HIDDEN * 6)
    gate_up_sweep = [
        moe.DECODE_GATE_UP,
        {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 8, "num_warps": 4},
        {"BLOCK_PAIRS": 16, "GROUPS_PER_STEP": 16, "num_warps": 4},
    ]
    for cfg in gate_up_sweep:
        yield timed(
            f"gate_up {_cfg_name(cfg)}", lambda cfg=cfg: gate_up(cfg), TOP_K * GATE_UP_BYTES
        )
    down_sweep = [
        moe.DECODE_DOWN,
        {"BLOCK_ROWS": 8, "GROUPS_PER_STEP": 16, "num_warps": 2},
        {"BLOCK_ROWS": 4, "GROUPS_PER_STEP": 8, "num_warps": 1},
    ]
    for cfg in down_sweep:
        yield timed(f"down {_cfg_name(cfg)}", lambda cfg=cfg: down(cfg), TOP_K * DOWN_BYTES)


def _cfg_name(cfg: dict) -> str:
    return "/".join(str(v) for v in cfg.values())


def main() -> None:
    started = time.time()
    torch.manual_seed(0)
    bw = copy_bandwidth(device=DEVICE)
    experts = make_experts()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_bytes_s": bw,
        "expert_bytes": EXPERT_BYTES,
        "configs": {
            "DECODE_MAX_PAIRS": moe.DECODE_MAX_PAIRS,
            "DECODE_GATE_UP": moe.DECODE_GATE_UP,
            "DECODE_DOWN": moe.DECODE_DOWN,
            "GROUPED_GATE_UP": moe.GROUPED_GATE_UP,
            "GROUPED_DOWN": moe.GROUPED_DOWN,
            "GROUPED_V2_GATE_UP": moe.GROUPED_V2_GATE_UP,
            "GROUPED_V2_DOWN": moe.GROUPED_V2_DOWN,
            "V2_TILE_CHANGES": {str(rows): c for rows, c in moe.V2_TILE_CHANGES.items()},
        },
        "paths": [],
        "kernels_t1": [],
    }
    print(
        f"# {result['gpu']}  torch {torch.__version__}  triton {triton.__version__}"
        f"  copy {bw / 1e12:.2f} TB/s  expert {EXPERT_BYTES / 1e6:.2f} MB"
    )
    print(f"{'path':22s} {'T':>5s} {'us':>9s} {'floor_us':>9s} {'%floor':>6s} {'TB/s':>6s} check")
    # Both paths at T=1, 4 and 8 show the crossover (DECODE_MAX_PAIRS = 32 means T <= 8 at top-4).
    plan = [(p, t) for p in ("decode", "decode_fp16") for t in (1, 4, 8)]
    plan += [("grouped", t) for t in (1, 4, 8)]
    # v1 against v2 where the grouped path serves (T > 32 for 120b, T > 16 for 20b), then v2's
    # config variants
    plan += [(p, t) for t in (16, 64, 256, 1024) for p in ("grouped", "grouped_v2")]
    plan += [(p, t) for t in (64, 256) for p in V2_VARIANTS if p != "grouped_v2"]
    for path, tokens in plan:
        row = bench_path(path, tokens, experts, bw)
        result["paths"].append(row)
        pct = 100 * row["floor_us"] / row["us"]
        ok = f"ok ({row['rel_err']:.1e})" if row["ok"] else f"MISMATCH ({row['rel_err']:.1e})"
        print(
            f"{path:22s} {tokens:5d} {row['us']:9.1f} {row['floor_us']:9.1f} {pct:5.0f}% "
            f"{row['tb_s']:6.2f} {ok} {row['note']}"
        )
        _write(result)  # after every row: a run cut short by a time limit keeps what finished
    print(f"\n{'kernel (T=1, do_bench)':34s} {'us':>8s} {'floor_us':>9s} {'TB/s':>6s}")
    for row in bench_kernels_t1(experts, bw):
        result["kernels_t1"].append(row)
        print(f"{row['kernel']:34s} {row['us']:8.1f} {row['floor_us']:9.1f} {row['tb_s']:6.2f}")
        _write(result)
    print(f"# {time.time() - started:.0f} s")


def ab_setup(note: str = "") -> tuple[float, ExpertWeights]:
    """The interleaved A/B scripts' start: (copy bandwidth, the random 120b experts), and their
    header line (GPU, versions, copy rate, `note`)."""
    bandwidth = copy_bandwidth()
    experts = make_experts()
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
          f" copy {bandwidth / 1e12:.2f} TB/s {note}".rstrip(), flush=True)  # fmt: skip
    return bandwidth, experts


def print_medians(rows: list[dict], key: str, names: list[str]) -> None:
    """Median us of each `key` value (names) at each token count, and against names[0]: the
    closing table of the interleaved A/B scripts (word_layouts_ab.py, gluon_moe_ab.py)."""
    print(f"median us per {key} (and against {names[0]}):")
    for tokens in sorted({r["tokens"] for r in rows}):

        def median_us(name: str, tokens: int = tokens) -> float:
            return statistics.median(r["us"] for r in rows
                                     if r["tokens"] == tokens and r[key] == name)  # fmt: skip

        base = median_us(names[0])
        for name in names:
            us = median_us(name)
            print(f"T={tokens:5d} {name:14s} {us:9.1f} us  {100 * (us / base - 1):+6.1f}%")


def write_rows(path: str, rows: list[dict], bandwidth: float, **extra) -> None:
    """The A/B scripts' JSON: the machine, the versions, the copy bandwidth, the rows and any
    `extra` keys."""
    import triton

    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "python": platform.python_version(),
                   "copy_bandwidth_bytes_s": bandwidth, "rows": rows, **extra}, f, indent=1)  # fmt: skip


def _write(result: dict) -> None:
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "kernels_moe.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
