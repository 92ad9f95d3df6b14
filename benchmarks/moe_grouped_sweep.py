"""Sweep the grouped MoE v2 kernels' tile configs on gpt-oss-120b shapes (batches past the GEMV).

    python benchmarks/moe_grouped_sweep.py [--tokens 64] [--confirm 256,1024] [--json PATH]

One MoE layer (hidden 2880, intermediate 2880, 128 experts, top-4, bf16, random packed weights),
timed as the model runs it: one CUDA graph of several back-to-back layer calls with different
routings, replayed (kernels_moe.py's harness). First the gate_up config is swept with the down
config at its default, then the down config with gate_up at its default, at `--tokens`; each row
is the whole layer's time, so the differences are the swept kernel's. Then the best pair (and the
defaults) run at each `--confirm` token count. Every config is checked once against the torch
reference (norm-wise relative error < 1e-2). floor_us: the distinct experts' bytes over the
device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics

import torch
import triton
from kernels_moe import ALPHA, LIMIT, TOP_K, check, floor_bytes, make_calls, make_experts
from timing import copy_bandwidth, graph_seconds_per_call

from gossamer.kernels import moe_mxfp4 as moe

# (REP, GROUPS_PER_STEP) pairs whose tiles fit the register file (REP * GROUPS_PER_STEP <= 16:
# offline sm_90 compiles of the larger ones use ~250 registers at REP 4 x 4 groups already).
TILES = [(4, 4), (2, 4), (2, 8), (1, 4), (1, 8), (1, 16)]
STAGES = [2, 3, 4]
WARPS = [4, 8]


def sweep_configs(tiles=TILES, stages=STAGES, warps=WARPS) -> list[dict]:
    return [
        {"REP": rep, "GROUPS_PER_STEP": groups, "NUM_STAGES": stage, "SCALE_PREFETCH": 1,
         "num_warps": warp}
        for (rep, groups), stage, warp in itertools.product(tiles, stages, warps)
    ]  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def _tiles(text: str) -> list[tuple[int, int]]:
    """Tiles written "1x4,2x4" -> [(1, 4), (2, 4)]: (REP, GROUPS_PER_STEP) pairs."""
    return [tuple(int(n) for n in t.split("x")) for t in text.split(",") if t]


def time_layer(
    experts, tokens: int, gate_up: dict, down: dict, bw: float, block_m: int | None = None
) -> dict:
    """One layer call with these configs: us per call, its floor, and the reference check."""

    def fn(x, logits):
        return moe.moe_mxfp4_grouped_v2(x, logits, experts, TOP_K, LIMIT, ALPHA, block_m=block_m,
                                        gate_up_config=gate_up, down_config=down)  # fmt: skip

    calls = make_calls(tokens, 8 if tokens <= 64 else 2, seed=tokens)
    ok, err = check(fn, experts, *calls[0])
    seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
    floor = statistics.mean(floor_bytes(logits)[0] for _, logits in calls) / bw
    return {"tokens": tokens, "block_m": block_m, "gate_up": gate_up, "down": down,
            "us": seconds * 1e6,
            "floor_us": floor * 1e6, "pct_floor": 100 * floor / seconds, "ok": ok,
            "rel_err": err}  # fmt: skip


def _name(cfg: dict) -> str:
    return "rep{REP} g{GROUPS_PER_STEP} s{NUM_STAGES} w{num_warps}".format(**cfg)


def _print(row: dict, label: str) -> None:
    print(f"T={row['tokens']:5d} {label:34s} {row['us']:9.1f} us  floor {row['floor_us']:7.1f}"
          f"  {row['pct_floor']:5.1f}%  ok={row['ok']}", flush=True)  # fmt: skip


def sweep(experts, tokens: int, which: str, bw: float, args) -> list[dict]:
    rows = []
    base_gu, base_dn = _defaults(args.block_m)
    for cfg in sweep_configs(_tiles(args.tiles), _ints(args.stages), _ints(args.sweep_warps)):
        gate_up = cfg if which == "gate_up" else base_gu
        down = cfg if which == "down" else base_dn
        try:
            row = time_layer(experts, tokens, gate_up, down, bw, args.block_m)
        except Exception as exc:  # noqa: BLE001 -- a config that fails to compile is a result
            print(f"T={tokens} {which} {_name(cfg)} failed: {type(exc).__name__}: {exc}"[:300])
            torch.cuda.synchronize()
            continue
        row["swept"] = which
        _print(row, f"{which} {_name(cfg)}")
        rows.append(row)
    return rows


def _defaults(block_m: int | None) -> tuple[dict, dict]:
    """The configs moe_mxfp4_grouped_v2 takes at this M-tile (None: the plain defaults)."""
    if block_m is None:
        return moe.GROUPED_V2_GATE_UP, moe.GROUPED_V2_DOWN
    return moe.v2_configs(block_m)


def best(rows: list[dict], which: str) -> dict:
    ok = [r for r in rows if r["swept"] == which and r["ok"]]
    return min(ok, key=lambda r: r["us"])[which]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--confirm", default="256,1024")
    parser.add_argument("--json", default=None)
    parser.add_argument("--block-ms", default=None,
                        help="instead of the sweep: the defaults and --warps at each BLOCK_M "
                             "(comma-separated) at --tokens and each --confirm count")  # fmt: skip
    parser.add_argument("--warps", default="4,8", help="num_warps tried with --block-ms")
    parser.add_argument("--maxnregs", default="0",
                        help="maxnreg launch options tried with --block-ms (0: ptxas's choice)")  # fmt: skip
    parser.add_argument(
        "--block-m",
        type=int,
        default=None,
        help="the sweep's M-tile (default: what the kernel picks per count)",
    )
    parser.add_argument(
        "--tiles",
        default=",".join(f"{r}x{g}" for r, g in TILES),
        help="REPxGROUPS_PER_STEP pairs the sweep tries",
    )
    parser.add_argument("--stages", default=",".join(map(str, STAGES)))
    parser.add_argument("--sweep-warps", default=",".join(map(str, WARPS)))
    parser.add_argument("--sync-ab", action="store_true",
                        help="instead of the sweep: tiles of 8 rows in each K order (--ab-orders "
                             "0: v2's, 1: moe_mxfp4.V2_SYNC_ORDER) x --ab-stages x --ab-groups, "
                             "at --tokens and --confirm, in --ab-rounds interleaved rounds")  # fmt: skip
    parser.add_argument("--ab-orders", default="0,1")
    parser.add_argument("--ab-stages", default="3,2")
    parser.add_argument("--ab-groups", default=str(moe.v2_configs(8)[0]["GROUPS_PER_STEP"]))
    parser.add_argument("--ab-rounds", type=int, default=2)
    parser.add_argument("--ab-prefetch", default="", help="SCALE_PREFETCH values (the tile's)")
    parser.add_argument("--ab-reps", default="", help="REP values (the tile's)")
    parser.add_argument("--ab-maxnreg", default="",
                        help="maxnreg launch options (0: none; default: the tile's)")  # fmt: skip
    parser.add_argument("--ab-padded", default="0",
                        help="moe_mxfp4.V2_PADDED_SCALES values (scales padded for async copies)")  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    experts = make_experts()
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton "
          f"{triton.__version__} copy {bw / 1e12:.2f} TB/s", flush=True)  # fmt: skip
    if args.block_ms:
        write(args, {"copy_bandwidth_bytes_s": bw, "block_m_rows": block_m_rows(experts, args, bw)})
        return
    if args.sync_ab:
        write(args, {"copy_bandwidth_bytes_s": bw, "sync_rows": sync_rows(experts, args, bw)})
        return
    base_gu, base_dn = _defaults(args.block_m)
    default = time_layer(experts, args.tokens, base_gu, base_dn, bw, args.block_m)
    _print(default, "defaults")
    rows = sweep(experts, args.tokens, "gate_up", bw, args)
    rows += sweep(experts, args.tokens, "down", bw, args)
    chosen = {"gate_up": best(rows, "gate_up"), "down": best(rows, "down")}
    confirm = []
    for tokens in [args.tokens] + [int(t) for t in args.confirm.split(",") if t]:
        for label, gu, dn in (
            ("defaults", base_gu, base_dn),
            ("best", chosen["gate_up"], chosen["down"]),
        ):
            row = time_layer(experts, tokens, gu, dn, bw, args.block_m) | {"label": label}
            _print(row, f"{label}: {_name(gu)} / {_name(dn)}")
            confirm.append(row)
    write(args, {"copy_bandwidth_bytes_s": bw, "defaults": default, "sweep": rows,
                 "best": chosen, "confirm": confirm})  # fmt: skip


def block_m_rows(experts, args, bw: float) -> list[dict]:
    """The default tiles (num_warps from --warps, maxnreg from --maxnregs) at each M-tile height:
    BLOCK_M 8 runs the MMA column tile at 8 (mma.sync on sm_90) where 16 takes wgmma, for batches
    of ~2 rows an expert. maxnreg 128 lets two 256-thread CTAs share an SM (prefill's 128-row
    tiles take 199-247 registers unbounded: one CTA an SM)."""
    rows = []
    shapes = list(itertools.product(_ints(args.block_ms), _ints(args.warps), _ints(args.maxnregs)))
    for tokens in [args.tokens] + _ints(args.confirm):
        for block_m, warps, maxnreg in shapes:
            gu = _with_maxnreg(moe.GROUPED_V2_GATE_UP | {"num_warps": warps}, maxnreg)
            dn = _with_maxnreg(moe.GROUPED_V2_DOWN | {"num_warps": warps}, maxnreg)
            name = f"BLOCK_M {block_m:3d} w{warps}" + (f" maxnreg={maxnreg}" if maxnreg else "")
            try:
                row = time_layer(experts, tokens, gu, dn, bw, block_m)
            except Exception as exc:  # noqa: BLE001 -- a failed compile is a result
                print(f"T={tokens} {name} failed: {exc}"[:300])
                continue
            _print(row, name)
            rows.append(row | {"maxnreg": maxnreg})
    return rows


def _with_maxnreg(config: dict, maxnreg: int) -> dict:
    config = {k: v for k, v in config.items() if k != "maxnreg"}
    return config | ({"maxnreg": maxnreg} if maxnreg else {})


def sync_rows(experts, args, bw: float) -> list[dict]:
    """BLOCK_M 8 with its default tile (V2_TILE_CHANGES[8]), the K order of v2 (wgmma's) against
    the mma.sync one (V2_SYNC_ORDER: 16-byte shared-memory loads of a thread's words, no scale
    shuffles), at each of --ab-stages pipeline stages, --ab-groups scale groups a step, and
    --ab-prefetch, --ab-reps and --ab-maxnreg values if given; the --ab-rounds rounds interleave
    the variants."""
    rows, saved = [], (moe.V2_SYNC_ORDER, moe.V2_PADDED_SCALES)
    prefetches = _ints(args.ab_prefetch) if args.ab_prefetch else [None]  # None: the tile's
    reps = _ints(args.ab_reps) if args.ab_reps else [None]
    maxnregs = _ints(args.ab_maxnreg) if args.ab_maxnreg else [None]
    variants = list(itertools.product((bool(o) for o in _ints(args.ab_orders)),
                                      _ints(args.ab_stages), _ints(args.ab_groups), prefetches,
                                      reps, maxnregs, (bool(p) for p in _ints(args.ab_padded))))  # fmt: skip
    try:
        for tokens in [args.tokens] + [int(t) for t in args.confirm.split(",") if t]:
            for _ in range(args.ab_rounds):
                for sync, stages, groups, prefetch, rep, maxnreg, padded in variants:
                    moe.V2_SYNC_ORDER, moe.V2_PADDED_SCALES = sync, padded
                    change = {"NUM_STAGES": stages, "GROUPS_PER_STEP": groups}
                    name = f"BLOCK_M 8 sync={int(sync)} s{stages} g{groups}"
                    if padded:
                        name += " padded"
                    if prefetch is not None:
                        change["SCALE_PREFETCH"] = prefetch
                        name += f" prefetch={prefetch}"
                    if rep is not None:
                        change["REP"] = rep
                        name += f" rep={rep}"
                    gu, dn = (c | change for c in moe.v2_configs(8))
                    if maxnreg is not None:  # 0: ptxas's own choice
                        gu, dn = (_with_maxnreg(c, maxnreg) for c in (gu, dn))
                        name += f" maxnreg={maxnreg}"
                    row = time_layer(experts, tokens, gu, dn, bw, 8) | {"sync": sync,
                                                                         "padded": padded}  # fmt: skip
                    _print(row, name)
                    rows.append(row)
    finally:
        moe.V2_SYNC_ORDER, moe.V2_PADDED_SCALES = saved
    return rows


def write(args, fields: dict) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(), **fields}  # fmt: skip
    path = args.json or (os.path.join(os.environ["OUT"], "moe_grouped_sweep.json")
                         if "OUT" in os.environ else None)  # fmt: skip
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
