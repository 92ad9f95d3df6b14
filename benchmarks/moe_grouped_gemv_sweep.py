"""The expert-grouped packed-fp16 MoE GEMV (gossamer/kernels/moe_grouped_gemv.py) against the decode
GEMV and grouped v2 on gpt-oss-120b shapes, and a sweep of its configs.

    python benchmarks/moe_grouped_gemv_sweep.py [--tokens 8,16,32,64,128] [--sweep-tokens 64]
        [--parts compare,block_m,gate_up,down,breakdown,ab,sort] [--json PATH]
    # JSON also to $OUT/moe_grouped_gemv_sweep.json, rewritten after every row

One MoE layer (hidden 2880, intermediate 2880, 128 experts, top-4, bf16, random packed weights in
the loader's GPU layout), timed as kernels_moe.py times it: one CUDA graph of several layer calls
with different routings, replayed; us per call. floor_us: the distinct experts' bytes (and the
activations) over the device-to-device copy bandwidth measured in the same run. reads: the expert
bytes each path streams (decode GEMV: one expert per pair; grouped GEMV: one per M-tile; v2 and
the floor: one per distinct expert) -> TB/s. Every row is checked once against the fp32 torch
reference (ok: norm-wise relative error < 1e-2).

  1. compare: decode_fp16, grouped_v2 and grouped_gemv (its defaults) at each --tokens;
  2. sweep (parts block_m, gate_up, down), at each --sweep-tokens: block_m x SPECIALIZE x
     UNROLL with the default kernel shapes; then gate_up shapes (down at its default, the best
     block_m), then down shapes; the best of each confirmed at every --tokens;
  3. breakdown at the first --sweep-tokens: graph times of the call's prefixes (routing, + the
     sort, + gate_up, + down, + the slot sum), so each stage's share shows; the sort both as
     moe_mxfp4's torch ops and as the one-launch expert_schedule the path uses;
  4. ab (not by default): at each --tokens, the defaults against the configurable changes since
     commit b2f528c (672 us at 64 tokens against the final code's 760): UNROLL 1, b2f528c's tiles
     (gate_up 16 pairs x 8 groups, down 32 rows x 8 groups), both, and the defaults capped at
     128 registers (4 programs of 4 warps per SM, as b2f528c's M = 4 body had);
  5. sort (not by default): routing alone, + moe_mxfp4._expert_schedule, + the one-launch
     expert_schedule, at each --tokens with grouped v2's BLOCK_M (v2 sorts with the one launch
     up to moe_grouped_gemv.SCHEDULE_MAX_PAIRS pairs: is it faster at 256-1024 tokens too?).
Each config compiles once (the token count is not a kernel constant); a failing config (e.g. one
that does not compile) is printed and skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels_moe as harness  # noqa: E402
from kernels_moe import ALPHA, LIMIT, TOP_K, calls_per_graph, check, floor_bytes, make_calls  # noqa: E402
from timing import copy_bandwidth, graph_seconds_per_call  # noqa: E402

from gossamer.kernels import moe_grouped_gemv as gemv  # noqa: E402
from gossamer.kernels import moe_mxfp4 as moe  # noqa: E402
from gossamer.kernels import pdl  # noqa: E402
from gossamer.ops.base import ExpertWeights  # noqa: E402

# (block_m, SPECIALIZE, UNROLL) with the default kernel configs otherwise
BLOCK_MS = [(1, 1, 2), (1, 1, 1), (2, 0, 2), (2, 1, 2), (2, 1, 1), (4, 0, 2), (4, 1, 2),
            (4, 1, 1), (8, 1, 2), (8, 1, 1)]  # fmt: skip
# (rows, GROUPS_PER_STEP, num_warps, NUM_STAGES): gate_up rows are intermediate pairs, down rows
# output rows; each keeps at least one 16-byte run per thread (gemv._check_config). Runs of 128,
# 256 and 512 bytes per row and step (8, 16, 32 groups), one or two runs per thread, both loop
# forms.
GATE_UP_SHAPES = [(8, 16, 4, 0), (16, 8, 4, 0), (4, 32, 4, 0), (8, 32, 8, 0), (16, 16, 4, 0),
                  (8, 16, 2, 0), (16, 16, 8, 0), (8, 16, 4, 3), (4, 32, 4, 3), (16, 8, 4, 3),
                  (8, 32, 8, 2)]  # fmt: skip
DOWN_SHAPES = [(16, 16, 4, 0), (32, 8, 4, 0), (8, 32, 4, 0), (16, 32, 8, 0), (32, 16, 4, 0),
               (16, 16, 2, 0), (32, 16, 8, 0), (16, 16, 4, 3), (8, 32, 4, 3), (32, 8, 4, 3),
               (16, 32, 8, 2)]  # fmt: skip


@dataclasses.dataclass
class Bench:
    experts: ExpertWeights
    bandwidth: float  # bytes/s of a device-to-device copy
    json_path: str | None
    result: dict

    def gemv_fn(self, block_m=None, gate_up=None, down=None):
        return lambda x, logits: gemv.moe_mxfp4_grouped_gemv(
            x, logits, self.experts, TOP_K, LIMIT, ALPHA, block_m, gate_up, down
        )

    def row(self, table: str, label: str, fn, tokens: int, path: str, block_m: int = 1):
        """Time one layer call; a failure (e.g. a config that does not compile) is printed."""
        try:
            row = self.time_layer(fn, tokens, path, block_m) | {"label": label}
        except Exception as exc:  # noqa: BLE001 -- a config that fails is a result, not the end
            print(f"T={tokens} {label} failed: {type(exc).__name__}: {exc}"[:400], flush=True)
            torch.cuda.synchronize()
            return None
        show(row, label)
        self.result[table].append(row)
        self.write()
        return row

    def time_layer(self, fn, tokens: int, path: str, block_m: int) -> dict:
        calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
        ok, err = check(fn, self.experts, *calls[0])
        seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
        floor = statistics.mean(floor_bytes(logits)[0] for _, logits in calls) / self.bandwidth
        reads = statistics.mean(expert_reads(logits, path, block_m) for _, logits in calls)
        return {"path": path, "tokens": tokens, "us": seconds * 1e6, "floor_us": floor * 1e6,
                "pct_floor": 100 * floor / seconds, "reads_mb": reads / 1e6,
                "tb_s": reads / seconds / 1e12, "ok": ok, "rel_err": err}  # fmt: skip

    def write(self) -> None:
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(self.result, indent=1))


def expert_reads(logits: torch.Tensor, path: str, block_m: int) -> int:
    """Expert bytes one call streams on `path` (no L2 reuse assumed)."""
    ids = torch.topk(logits.float(), TOP_K, dim=-1).indices.flatten()
    counts = torch.bincount(ids, minlength=logits.shape[1]).tolist()
    if path == "decode_fp16":
        reads = sum(counts)
    elif path == "grouped_gemv":
        reads = sum(math.ceil(c / block_m) for c in counts)
    else:
        reads = sum(c > 0 for c in counts)
    return reads * harness.EXPERT_BYTES


def show(row: dict, label: str) -> None:
    print(f"T={row['tokens']:4d} {label:58s} {row['us']:8.1f} us  floor {row['floor_us']:6.1f}"
          f" {row['pct_floor']:5.1f}%  reads {row['reads_mb']:7.1f} MB {row['tb_s']:5.2f} TB/s"
          f"  ok={row['ok']} ({row['rel_err']:.1e})", flush=True)  # fmt: skip


def configs(shapes: list, rows_key: str, default: dict) -> list[dict]:
    return [default | {rows_key: r, "GROUPS_PER_STEP": g, "num_warps": w, "NUM_STAGES": s}
            for r, g, w, s in shapes]  # fmt: skip


def name(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def default_block_m(tokens: int) -> int:
    return gemv.default_block_m(tokens * TOP_K, harness.EXPERTS)


def compare(bench: Bench, tokens_list: list[int], chosen: dict | None = None, tag: str = ""):
    """decode_fp16, grouped_v2 and the grouped GEMV (defaults, or `chosen`) at each T."""
    chosen = chosen or {}
    for tokens in tokens_list:
        for path in ("decode_fp16", "grouped_v2") if not chosen else ():
            bench.row("compare", path, harness.path_fn(path, bench.experts), tokens, path)
        block_m = chosen.get("block_m") or default_block_m(tokens)
        fn = bench.gemv_fn(block_m, chosen.get("gate_up"), chosen.get("down"))
        bench.row("compare", f"grouped_gemv{tag} block_m={block_m}", fn, tokens,
                  "grouped_gemv", block_m)  # fmt: skip


def best_of(rows: list) -> tuple | None:
    """(us, key) of the fastest checked row of (row, key) pairs; None if none ran."""
    timed = [(row["us"], key) for row, key in rows if row and row["ok"]]
    return min(timed, key=lambda t: t[0]) if timed else None


def sweep(bench: Bench, tokens: int, parts: set[str]) -> dict:
    """block_m x SPECIALIZE x UNROLL, then gate_up shapes, then down shapes (one kernel varied
    at a time, the other at its default or the best so far); returns the best of each part run
    (the defaults for the others)."""
    chosen = {"block_m": default_block_m(tokens), "gate_up": gemv.GEMV_GATE_UP,
              "down": gemv.GEMV_DOWN}  # fmt: skip
    if "block_m" in parts:
        rows = []
        for block_m, specialize, unroll in BLOCK_MS:
            changes = {"SPECIALIZE": specialize, "UNROLL": unroll}
            fn = bench.gemv_fn(block_m, gemv.GEMV_GATE_UP | changes, gemv.GEMV_DOWN | changes)
            row = bench.row("sweep", f"block_m={block_m} {name(changes)}", fn, tokens,
                            "grouped_gemv", block_m)  # fmt: skip
            rows.append((row, (block_m, changes)))
        if best := best_of(rows):
            _, (block_m, changes) = best
            chosen = {"block_m": block_m, "gate_up": gemv.GEMV_GATE_UP | changes,
                      "down": gemv.GEMV_DOWN | changes}  # fmt: skip
    for which, key, shapes in (("gate_up", "BLOCK_PAIRS", GATE_UP_SHAPES),
                               ("down", "BLOCK_ROWS", DOWN_SHAPES)):  # fmt: skip
        if which not in parts:
            continue
        rows = []
        for config in configs(shapes, key, chosen[which]):
            pair = chosen | {which: config}
            fn = bench.gemv_fn(chosen["block_m"], pair["gate_up"], pair["down"])
            row = bench.row("sweep", f"{which} {name(config)}", fn, tokens, "grouped_gemv",
                            chosen["block_m"])  # fmt: skip
            rows.append((row, config))
        if best := best_of(rows):
            chosen[which] = best[1]
    print(f"# best at T={tokens}: {chosen}", flush=True)
    return chosen


def breakdown(bench: Bench, tokens: int) -> None:
    """Graph times of the call's prefixes: each stage's cost is a difference of two rows."""
    experts = bench.experts
    num_experts, block_m = harness.EXPERTS, default_block_m(tokens)
    common = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "BLOCK_M": block_m,
              "ACT_EXP": moe.act_exponent(LIMIT), "LAYOUT": moe.layout_code(experts),
              **pdl.launch_options(experts.gate_up_blocks.device)}  # fmt: skip
    grid_m = gemv.max_m_tiles(tokens * TOP_K, num_experts, block_m)

    def prefix(stages: int, torch_sort: bool = False):
        sort = moe._expert_schedule if torch_sort else gemv.expert_schedule

        def fn(x, logits):
            ids, route_w, x_h, x_unscale = moe.route_fp16(logits, TOP_K, x)
            if stages >= 2:
                schedule = sort(ids, num_experts, block_m)
            if stages >= 3:
                act = gemv.gate_up(x_h, x_unscale, schedule, experts, TOP_K, LIMIT, ALPHA,
                                   grid_m, common, gemv.GEMV_GATE_UP)  # fmt: skip
            if stages >= 4:
                y = gemv.down(act, schedule, route_w, experts, x.shape[1], grid_m, common,
                              gemv.GEMV_DOWN)  # fmt: skip
            if stages >= 5:
                gemv.slot_sum(y, torch.empty_like(x), TOP_K)
            return x

        return fn

    calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
    previous = route_seconds = 0.0
    stages = [("route", 1, False), ("+ sort (torch ops)", 2, True), ("+ sort", 2, False),
              ("+ gate_up", 3, False), ("+ down", 4, False), ("+ slot sum", 5, False)]  # fmt: skip
    for stage, count, torch_sort in stages:
        fn = prefix(count, torch_sort)
        seconds = graph_seconds_per_call([lambda x=x, lg=lg, fn=fn: fn(x, lg) for x, lg in calls])
        if stage == "+ sort":  # the fused sort's cost is against routing alone
            previous = route_seconds
        route_seconds = seconds if stage == "route" else route_seconds
        row = {"tokens": tokens, "block_m": block_m, "stages": stage, "us": seconds * 1e6,
               "stage_us": (seconds - previous) * 1e6}  # fmt: skip
        previous = seconds
        bench.result["breakdown"].append(row)
        bench.write()
        print(f"T={tokens:4d} {stage:20s} {row['us']:8.1f} us  (this stage {row['stage_us']:6.1f})",
              flush=True)  # fmt: skip


def ab(bench: Bench, tokens_list: list[int]) -> None:
    """The defaults against each configurable change since b2f528c (see the module docstring)."""
    old_gate_up = {"BLOCK_PAIRS": 16, "GROUPS_PER_STEP": 8}
    old_down = {"BLOCK_ROWS": 32, "GROUPS_PER_STEP": 8}
    variants = {
        "defaults": ({}, {}, {}),
        "UNROLL=1": ({"UNROLL": 1}, {}, {}),
        "b2f528c tiles": ({}, old_gate_up, old_down),
        "b2f528c tiles UNROLL=1": ({"UNROLL": 1}, old_gate_up, old_down),
        "maxnreg=128": ({"maxnreg": 128}, {}, {}),
    }
    for tokens in tokens_list:
        block_m = default_block_m(tokens)
        for label, (both, gate_up, down) in variants.items():
            fn = bench.gemv_fn(block_m, gemv.GEMV_GATE_UP | both | gate_up,
                               gemv.GEMV_DOWN | both | down)  # fmt: skip
            bench.row("ab", f"{label} block_m={block_m}", fn, tokens, "grouped_gemv", block_m)


def sort_times(bench: Bench, tokens_list: list[int]) -> None:
    """Graph times of routing alone and with each sort, at grouped v2's BLOCK_M."""
    for tokens in tokens_list:
        calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
        block_m = moe._block_m(tokens * TOP_K, harness.EXPERTS)
        route_us = None
        for label, sort in (("route", None), ("+ torch sort", moe._expert_schedule),
                            ("+ one-launch sort", gemv.expert_schedule)):  # fmt: skip

            def fn(x, logits, sort=sort, block_m=block_m):
                ids = moe.route_fp16(logits, TOP_K, x)[0]
                if sort is not None:
                    sort(ids, harness.EXPERTS, block_m)
                return x

            us = 1e6 * graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
            route_us = us if route_us is None else route_us
            row = {"tokens": tokens, "block_m": block_m, "stages": label, "us": us,
                   "sort_us": us - route_us}  # fmt: skip
            bench.result["sort"].append(row)
            bench.write()
            print(
                f"T={tokens:4d} {label:20s} {us:8.1f} us  (sort {us - route_us:6.1f})", flush=True
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", default="8,16,32,64,128")
    parser.add_argument("--sweep-tokens", default="64")
    parser.add_argument("--parts", default="compare,block_m,gate_up,down,breakdown",
                        help="what to run (a long sweep may need several calls)")  # fmt: skip
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",") if t]
    sweep_tokens = [int(t) for t in args.sweep_tokens.split(",") if t]
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(device=harness.DEVICE)
    experts = harness.make_experts()
    json_path = args.json or (os.path.join(os.environ["OUT"], "moe_grouped_gemv_sweep.json")
                              if "OUT" in os.environ else None)  # fmt: skip
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(),
              "copy_bandwidth_bytes_s": bandwidth, "layout": experts.layout,
              "defaults": {"gate_up": gemv.GEMV_GATE_UP, "down": gemv.GEMV_DOWN,
                           "block_m_by_pairs": gemv.BLOCK_M_BY_PAIRS},
              "compare": [], "sweep": [], "best": {}, "breakdown": [], "ab": [],
              "sort": []}  # fmt: skip
    bench = Bench(experts, bandwidth, json_path, result)
    print(f"# {result['gpu']} torch {torch.__version__} triton {triton.__version__} copy "
          f"{bandwidth / 1e12:.2f} TB/s, layout {experts.layout}", flush=True)  # fmt: skip
    parts = set(args.parts.split(","))
    if "compare" in parts:
        compare(bench, tokens_list)
    if parts & {"block_m", "gate_up", "down"}:
        for tokens in sweep_tokens:
            chosen = sweep(bench, tokens, parts)
            result["best"][str(tokens)] = chosen
            compare(bench, tokens_list, chosen, tag=f" best@{tokens}")
    if "breakdown" in parts:
        for tokens in sweep_tokens[:1]:
            breakdown(bench, tokens)
    if "ab" in parts:
        ab(bench, tokens_list)
    if "sort" in parts:
        sort_times(bench, tokens_list)
    bench.write()


if __name__ == "__main__":
    main()
