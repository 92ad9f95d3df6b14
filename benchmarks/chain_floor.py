"""How fast a batch-1 decode step could be as a chain of separate kernels: the bytes of each
kernel of a real step, read by a plain streaming kernel, one launch per kernel, chained with PDL
in one CUDA graph. The gap between that and the byte floor is what the kernel boundaries cost on
their own; the gap between it and the model's step is what the real kernels add.

    python benchmarks/chain_floor.py [--models gpt-oss-20b,gpt-oss-120b] [--context 1024]
                                     [--json PATH]

Per layer the step's kernels are (decode_speed.step_bytes counts the same bytes): the attention
norm, QKV, attention over the KV cache, O, the MoE norm, the router, the routing, gate_up (top-k
experts), down; then the final norm and the unembedding. Modes:
  one     one kernel reading every byte of the step (the streaming rate, no boundaries)
  big     one kernel per weight matrix (QKV, attention's KV, O, router, gate_up, down, unembed)
  all     big plus a one-program kernel for each small step (norms, routing, sampling)
  big_tiled / all_tiled  big / all on all's best grid with QKV and O read as the batch-1 GEMV
          tiles them (16 rows x 128 bytes a tile, one-warp programs, split K: _tiled_kernel)
  big_packed / all_packed  the same tiles and grid from a weight repacked tile by tile (each
          2 KB tile contiguous, a program's tiles one after another)
  all_experts_tiled  all with the top-k experts' packed words (not their scales: 1/17 of the
          bytes) read as the batch-1 MoE GEMVs tile them: gate_up 32 rows (16 gate/up pairs) x
          256 bytes a step on 4 warps, one program per 32 rows; down one row of each of the k
          experts x 256 bytes a step on one warp, one program per output row
  all_experts_packed  the same tiles and grid from experts repacked by program (each program's
          steps one contiguous run: 8 KB tiles for gate_up, 1 KB for down). An upper bound: a down
          program's rows belong to the four experts its token picked at run time, so no layout
          makes them one run
  all_gate_up_packed  all_experts_tiled with only gate_up repacked (buildable: a gate_up
          program's 32 rows are one expert's)
  -<kind> all without the kernels of one kind (-qkv, -gate_up, -small, ...), on all's best grid:
          the kind's marginal cost in the chain, to set beside fusion_ab.py's knock-outs
Each streaming kernel loads its first tile before its PDL wait and the rest after (as the model's
kernels do with their weights); each program reads a contiguous run. The table gives the best of a
few grid shapes (programs per SM x tile), the ms per step and the kernels per step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from timing import copy_bandwidth, graph_seconds_per_call

from gossamer.config import ModelConfig
from gossamer.kernels import gemv, pdl
from gossamer.presets import preset

SMALL_BYTES = 16 << 10  # a one-program kernel: the norms, the routing, the sampling


@dataclass(frozen=True)
class Segment:
    name: str
    nbytes: int
    shape: tuple[int, int] | None = None  # a bf16 weight's [out, in] (the dense projections)
    # (top-k, rows of an expert, int32 words a row) of the expert matrices read (the MoE GEMVs)
    expert_words: tuple[int, int, int] | None = None


def step_segments(cfg: ModelConfig, context: int, small: bool = True) -> list[Segment]:
    """The kernels of one batch-1 decode step and the bytes each reads (the small ones, with
    `small`, as SMALL_BYTES each)."""
    hidden, inter, experts = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    expert_bytes = (2 * inter * hidden, hidden * inter)  # gate_up, down: e2m1 + e8m0 per 32
    tiny = [Segment("small", SMALL_BYTES)] if small else []
    segments = []
    for layer in range(cfg.num_hidden_layers):
        seen = min(context, cfg.sliding_window) if cfg.is_sliding(layer) else context
        qkv = (cfg.q_size + 2 * cfg.kv_size, hidden)
        segments += tiny + [
            Segment("qkv", 2 * qkv[0] * qkv[1], qkv),
            Segment("attention", 2 * seen * cfg.kv_size * 2),
            Segment("o", 2 * cfg.q_size * hidden, (hidden, cfg.q_size)),
        ]
        segments += tiny + [Segment("router", 2 * hidden * experts)] + tiny
        top_k = cfg.num_experts_per_tok
        segments += [
            Segment(name, round(top_k * size * (0.5 + 1 / 32)),
                    expert_words=(top_k, rows, size // rows // 8))
            for name, size, rows in zip(("gate_up", "down"), expert_bytes, (2 * inter, hidden),
                                        strict=True)
        ]  # fmt: skip
    return segments + tiny + [Segment("unembed", 2 * cfg.vocab_size * hidden)] + tiny


@triton.jit
def _stream_kernel(src, out, num_words, words_per_program, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):  # fmt: skip
    """Program p adds up words [p * words_per_program, +words_per_program) of src (int32, wrapping)
    into out[p]: the first tile before the PDL wait, the rest after, each tile loaded while the
    one before it is added (two in flight)."""
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * words_per_program
    end = tl.minimum(first + words_per_program, num_words)
    lanes = tl.arange(0, BLOCK)
    upcoming = tl.load(src + first + lanes, mask=first + lanes < end, other=0)
    pdl.wait(PDL)
    acc = tl.zeros([BLOCK], tl.int32)
    for offset in range(BLOCK, words_per_program + BLOCK, BLOCK):
        tile = upcoming
        at = first + offset + lanes
        upcoming = tl.load(src + at, mask=at < end, other=0)
        acc += tile
    tl.store(out + pid, tl.sum(acc, axis=0))


@triton.jit
def _tiled_kernel(src, out, num_rows, row_words, words_per_split, row_step, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PDL: tl.constexpr, PACKED: tl.constexpr = False,
                  ROW_GROUP: tl.constexpr = 0):  # fmt: skip
    """The batch-1 GEMV's reads without its arithmetic: program (n, k) adds up rows
    [n * BLOCK_N, +BLOCK_N) of src [num_rows, row_words] (int32) over its K split, in tiles of
    BLOCK_N rows x BLOCK_K words (one 128-byte line of each row at BLOCK_K 32), two in flight,
    the first before the PDL wait. PACKED: the same tiles, as if the weight were repacked so that
    each tile is one contiguous run and a program's tiles follow each other (src then holds the
    packed words; the sums are of other words, the bytes and the grid are the same). ROW_GROUP
    (> 0): program n's rows are n * ROW_GROUP + i * row_step instead (the MoE down GEMV's one row
    of each expert)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if ROW_GROUP > 0:
        row_ids = pid_n * ROW_GROUP + tl.arange(0, BLOCK_N) * row_step
    else:
        row_ids = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(row_ids, num_rows - 1).to(tl.int64)  # clamped: loaded, then left out
    begin = pid_k * words_per_split
    end = tl.minimum(begin + words_per_split, row_words)
    cols = tl.arange(0, BLOCK_K)
    if PACKED:  # tile t of this program at (program * words_per_split + t * BLOCK_K) * BLOCK_N
        program = pid_n.to(tl.int64) * tl.num_programs(1) + pid_k
        local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_K + cols[None, :]
        ptrs = src + program * words_per_split * BLOCK_N + local
        step = BLOCK_N  # words of the packed buffer per word of a row
    else:
        ptrs = src + rows[:, None] * row_words + begin + cols[None, :]
        step = 1
    upcoming = tl.load(ptrs, mask=(begin + cols < end)[None, :], other=0)
    pdl.wait(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.int32)
    for offset in range(BLOCK_K, words_per_split + BLOCK_K, BLOCK_K):
        tile = upcoming
        upcoming = tl.load(ptrs + offset * step, mask=(begin + offset + cols < end)[None, :],
                           other=0)  # fmt: skip
        acc += tile
    acc = tl.where((row_ids < num_rows)[:, None], acc, 0)
    tl.store(out + pid_n * tl.num_programs(1) + pid_k, tl.sum(tl.sum(acc, axis=1), axis=0))


TILE_ROWS, TILE_WORDS = 16, 32  # the batch-1 QKV / O tiles (gemv.CONFIGS "tall_m1", "medium")


def tiled_plan(rows: int, row_words: int, num_sms: int) -> tuple[int, int, int]:
    """(row blocks, K splits, words per split) as gemv.plan_gemv plans the batch-1 QKV / O
    (bf16: two per int32 word) on their tiles, by shape: more rows than columns is QKV's
    ("tall_m1": unsplit since the sixteenth session), else O's ("medium": split)."""
    config = gemv.CONFIGS["tall_m1" if rows > 2 * row_words else "medium"]
    plan = gemv.plan_gemv(1, rows, 2 * row_words, num_sms, config)
    if (plan.config.block_n, plan.config.block_k) != (TILE_ROWS, 2 * TILE_WORDS):
        raise ValueError(f"the GEMV's tile changed to {plan.config}: update TILE_ROWS / _WORDS")
    return plan.row_blocks, plan.split_k, plan.k_per_split // 2


def stream_tiled(src: torch.Tensor, out: torch.Tensor, num_sms: int, packed: bool = False) -> None:
    """Launch _tiled_kernel over src [rows, row_words] (int32) as the GEMV would tile it; with
    `packed`, src is read as the tile-contiguous repack of such a weight (see _tiled_kernel: it
    must then hold row blocks x splits x TILE_ROWS x words per split words)."""
    rows, row_words = src.shape
    row_blocks, splits, per_split = tiled_plan(rows, row_words, num_sms)
    _tiled_kernel[(row_blocks, splits)](src, out, rows, row_words, per_split, 1,
                                        BLOCK_N=TILE_ROWS, BLOCK_K=TILE_WORDS, PACKED=packed,
                                        num_warps=1, **pdl.launch_options(src.device))  # fmt: skip


# moe_mxfp4's batch-1 GEMV tiles: gate_up BLOCK_PAIRS 16 (32 rows) x GROUPS_PER_STEP 16 (64
# words) on 4 warps; down BLOCK_ROWS 1 x the k experts x 64 words on 1 warp; neither split
EXPERT_WORDS_A_STEP = 64


def expert_tiling(name: str, rows: int, top_k: int) -> tuple[int, int, dict]:
    """(programs, row_step, _tiled_kernel tile constexprs) of the batch-1 gate_up or down GEMV
    over the top-k experts' [k * rows] rows."""
    if name == "gate_up":
        return triton.cdiv(rows, 32), 1, dict(BLOCK_N=32, num_warps=4)
    return rows // top_k, rows // top_k, dict(BLOCK_N=top_k, ROW_GROUP=1, num_warps=1)


def packed_expert_words(name: str, rows: int, row_words: int, top_k: int) -> int:
    """Words of the experts repacked so that each program's steps are one contiguous run (its
    steps' tiles of BLOCK_N rows x EXPERT_WORDS_A_STEP words, one after another)."""
    programs, _, tile = expert_tiling(name, rows, top_k)
    steps = triton.cdiv(row_words, EXPERT_WORDS_A_STEP)
    return programs * steps * tile["BLOCK_N"] * EXPERT_WORDS_A_STEP


def stream_experts_tiled(src: torch.Tensor, out: torch.Tensor, name: str, top_k: int,
                         packed: bool = False) -> None:  # fmt: skip
    """Launch _tiled_kernel over the top-k experts' words src [k * rows, row_words] as the batch-1
    gate_up or down GEMV reads them; with `packed`, src is read as their repack by program
    (it must then hold packed_expert_words words)."""
    rows, row_words = src.shape
    programs, row_step, tile = expert_tiling(name, rows, top_k)
    per_program = row_words  # a packed program's run: whole tiles (the last one's tail unread)
    if packed:
        per_program = triton.cdiv(row_words, EXPERT_WORDS_A_STEP) * EXPERT_WORDS_A_STEP
    _tiled_kernel[(programs,)](src, out, rows, row_words, per_program, row_step,
                               BLOCK_K=EXPERT_WORDS_A_STEP, PACKED=packed, **tile,
                               **pdl.launch_options(src.device))  # fmt: skip


@dataclass(frozen=True)
class Grid:
    programs_per_sm: int
    block: int  # int32 words per tile
    num_warps: int = 4


def launch_plan(nbytes: int, grid: Grid, num_sms: int) -> tuple[int, int]:
    """(programs, words per program, a multiple of the tile) for a segment of nbytes: one program
    for small segments, else up to programs_per_sm * num_sms, each at least one tile."""
    words = math.ceil(nbytes / 4)
    if nbytes <= SMALL_BYTES:
        return 1, triton.cdiv(words, grid.block) * grid.block
    programs = min(grid.programs_per_sm * num_sms, triton.cdiv(words, grid.block))
    per_program = triton.cdiv(triton.cdiv(words, programs), grid.block) * grid.block
    return triton.cdiv(words, per_program), per_program


def stream(src: torch.Tensor, out: torch.Tensor, grid: Grid, num_sms: int) -> None:
    """Launch _stream_kernel over all of src (int32) with the plan for its size."""
    programs, per_program = launch_plan(src.numel() * 4, grid, num_sms)
    _stream_kernel[(programs,)](src, out, src.numel(), per_program, BLOCK=grid.block,
                                num_warps=grid.num_warps, **pdl.launch_options(src.device))  # fmt: skip


def chain_calls(segments: list[Segment], grid: Grid, device: torch.device,
                tiled: str | None = None) -> list:  # fmt: skip
    """One launch per segment, each over its own buffer (so that nothing is read from L2); with
    `tiled` ("rows" or "packed"), segments with a shape are read in the GEMV's row-block tiles
    (_tiled_kernel), from the weight as it is or repacked tile by tile; with "experts", the
    expert segments in the MoE GEMVs' tiles."""
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(max(launch_plan(s.nbytes, grid, num_sms)[0] for s in segments) + 8192,
                      dtype=torch.int32, device=device)  # fmt: skip
    calls = []
    for segment in segments:
        if tiled in EXPERT_MODES and segment.expert_words is not None:
            top_k, rows, words = segment.expert_words
            src = torch.ones(top_k * rows, words, dtype=torch.int32, device=device)
            packed = segment.name in EXPERT_MODES[tiled]
            if packed:
                size = packed_expert_words(segment.name, top_k * rows, words, top_k)
                whole = torch.ones(size, dtype=torch.int32, device=device)
                src = whole.as_strided(src.shape, src.stride())  # the shape for the plan
            calls.append(lambda src=src, name=segment.name, k=top_k, p=packed:
                         stream_experts_tiled(src, out, name, k, p))  # fmt: skip
            continue
        if tiled in ("rows", "packed") and segment.shape is not None:
            rows, cols = segment.shape
            src = torch.ones(rows, cols // 2, dtype=torch.int32, device=device)  # bf16 pairs
            if tiled == "packed":  # whole tiles: the ragged ends padded (< 1% more bytes)
                row_blocks, splits, per_split = tiled_plan(rows, cols // 2, num_sms)
                packed = torch.ones(row_blocks * splits * TILE_ROWS * per_split,
                                    dtype=torch.int32, device=device)  # fmt: skip
                src = packed.as_strided(src.shape, src.stride())  # the shape for the plan
            calls.append(lambda src=src: stream_tiled(src, out, num_sms, tiled == "packed"))
            continue
        # whole 64-byte runs: the JIT then knows the length divisible by 16 and the loads vectorize
        src = torch.ones(16 * math.ceil(segment.nbytes / 64), dtype=torch.int32, device=device)
        calls.append(lambda src=src: stream(src, out, grid, num_sms))
    return calls


# chain_calls' `tiled` modes that read the experts as the MoE GEMVs tile them -> the kinds read
# from a repack by program
EXPERT_MODES = {
    "experts": (),
    "experts_packed": ("gate_up", "down"),
    "gate_up_packed": ("gate_up",),
}
GRIDS = [Grid(4, 2048), Grid(8, 1024), Grid(8, 2048), Grid(16, 1024), Grid(4, 4096, num_warps=8)]


def chain_ms(segments: list[Segment], grid: Grid, device: torch.device,
             tiled: str | None = None) -> float:  # fmt: skip
    """ms per step of the chain in one CUDA graph."""
    calls = chain_calls(segments, grid, device, tiled)
    seconds = len(calls) * graph_seconds_per_call(calls, repeats=20)
    del calls
    torch.cuda.empty_cache()
    return 1e3 * seconds


def measure(cfg: ModelConfig, context: int, device: torch.device) -> dict[str, dict]:
    """Each mode's best ms per step over GRIDS, with the grid and the kernel count; then, on the
    best grid of "all", the chain without each kind of kernel ("-qkv", ...): that kind's marginal
    cost, as fusion_ab.py's knock-outs measure it in the model's graph."""
    every = step_segments(cfg, context)
    modes = {
        "one": [Segment("step", sum(s.nbytes for s in every))],
        "big": step_segments(cfg, context, small=False),
        "all": every,
    }
    results = {}
    for mode, segments in modes.items():
        times = {grid: chain_ms(segments, grid, device) for grid in GRIDS}
        best = min(times, key=times.get)
        results[mode] = {"ms": times[best], "kernels": len(segments),
                         "bytes": sum(s.nbytes for s in segments), "grid": vars(best),
                         "all_grids_ms": list(times.values())}  # fmt: skip
    best = Grid(**results["all"]["grid"])
    for mode, tiled in itertools.product(("big", "all"), ("rows", "packed")):
        segments = modes[mode]  # QKV and O read as the GEMV tiles them, the rest as before
        name = f"{mode}_tiled" if tiled == "rows" else f"{mode}_packed"
        results[name] = {"ms": chain_ms(segments, best, device, tiled), "kernels": len(segments),
                         "bytes": sum(s.nbytes for s in segments), "grid": vars(best),
                         "all_grids_ms": []}  # fmt: skip
    for tiled in EXPERT_MODES:
        results[f"all_{tiled}" if tiled != "experts" else "all_experts_tiled"] = {
            "ms": chain_ms(every, best, device, tiled), "kernels": len(every),
            "bytes": sum(s.nbytes for s in every), "grid": vars(best), "all_grids_ms": [],
        }  # fmt: skip
    for name in dict.fromkeys(s.name for s in every):
        kept = [s for s in every if s.name != name]
        results[f"-{name}"] = {"ms": chain_ms(kept, best, device), "kernels": len(kept),
                               "bytes": sum(s.nbytes for s in kept), "grid": vars(best),
                               "all_grids_ms": []}  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt-oss-20b,gpt-oss-120b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = copy_bandwidth()
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s")
    rows = []
    for name in args.models.split(","):
        cfg = preset(name)
        for mode, result in measure(cfg, args.context, device).items():
            floor_ms = 1e3 * result["bytes"] / bandwidth
            rows.append({"model": name, "mode": mode, "floor_ms": floor_ms, **result})
            print(f"{name:13} {mode:10} {result['ms']:7.3f} ms  {result['kernels']:4} kernels  "
                  f"floor {floor_ms:.3f} ms  grid {result['grid']}  all "
                  f"{' '.join(f'{t:.3f}' for t in result['all_grids_ms'])}", flush=True)  # fmt: skip
        by_mode = {r["mode"]: r for r in rows if r["model"] == name}
        extra = by_mode["all"]["ms"] - by_mode["one"]["ms"]
        print(
            f"{name}: kernel boundaries cost {extra:.3f} ms a step "
            f"({1e3 * extra / by_mode['all']['kernels']:.2f} us a kernel)"
        )
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": triton.__version__, "python": platform.python_version(),
                "copy_tb_s": bandwidth / 1e12, "context": args.context}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
