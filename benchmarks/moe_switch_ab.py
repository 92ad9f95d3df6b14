"""One gpt-oss-120b MoE layer with a module switch of gossamer/kernels (moe_mxfp4's by default) at
each of its values, interleaved: the layer A/B for flags read at call time (V2_GEMV_MAX_COUNT,
V2_BF16_PARTIALS, moe_grouped_gemv.LOOP_M_ROWS, ...).

    python benchmarks/moe_switch_ab.py --switch V2_GEMV_MAX_COUNT --values 0,1 [--tokens 64,256]
        [--rounds 3] [--json PATH]

Each value is set on the module while the call is checked against the torch reference and its
CUDA graph captured (the graph keeps the kernels it captured), then the module's own value is
restored. Values are Python literals (1 and 0 for a bool switch). Timed as the model runs it:
back-to-back calls with different routings in one CUDA graph (kernels_moe.py), through the
default dispatch (`moe_mxfp4.moe_mxfp4`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os

from kernels_moe import (
    ALPHA,
    LIMIT,
    TOP_K,
    ab_setup,
    calls_per_graph,
    check,
    make_calls,
    print_medians,
    write_rows,
)
from timing import graph_seconds_per_call

from gossamer.kernels import moe_mxfp4 as moe


def switch_target(switch: str) -> tuple[object, str]:
    """(module, name) of "NAME" (in moe_mxfp4) or "MODULE.NAME" (a gossamer.kernels module)."""
    module_name, _, name = switch.rpartition(".")
    module = importlib.import_module(f"gossamer.kernels.{module_name}") if module_name else moe
    if not hasattr(module, name):
        raise SystemExit(f"{module.__name__} has no {name}")
    return module, name


def time_value(experts, switch: str, value, calls) -> dict:
    """One layer's time per call with the switch (`switch_target`) set to value."""

    def fn(x, logits):
        return moe.moe_mxfp4(x, logits, experts, TOP_K, LIMIT, ALPHA)

    module, name = switch_target(switch)
    default = getattr(module, name)
    setattr(module, name, type(default)(value))
    try:
        ok, err = check(fn, experts, *calls[0])
        seconds = graph_seconds_per_call([lambda x=x, lg=lg: fn(x, lg) for x, lg in calls])
    finally:
        setattr(module, name, default)
    return {"value": str(value), "tokens": calls[0][0].shape[0], "us": seconds * 1e6, "ok": ok,
            "rel_err": err}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--switch", required=True,
                        help="a module global: NAME of moe_mxfp4, or MODULE.NAME")  # fmt: skip
    parser.add_argument("--values", required=True, help="comma-separated, the baseline first")
    parser.add_argument("--tokens", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    switch_target(args.switch)  # fails early on an unknown switch
    values = [ast.literal_eval(v) for v in args.values.split(",")]
    bandwidth, experts = ab_setup(f"{args.switch} in {values}")
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        calls = make_calls(tokens, calls_per_graph(tokens), seed=tokens)
        for _ in range(args.rounds):
            for value in values:
                row = time_value(experts, args.switch, value, calls)
                print(f"T={tokens:5d} {args.switch}={value!s:6s} {row['us']:9.1f} us  "
                      f"ok={row['ok']} err={row['rel_err']:.1e}", flush=True)  # fmt: skip
                rows.append(row)
    print_medians(rows, "value", [str(v) for v in values])
    path = args.json or os.path.join(os.environ.get("OUT", "."), "moe_switch_ab.json")
    write_rows(path, rows, bandwidth, switch=args.switch)


if __name__ == "__main__":
    main()
