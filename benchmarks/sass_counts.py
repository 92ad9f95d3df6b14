"""Instructions per weight of the MoE kernels (decode GEMVs, grouped v1 and v2), from SASS compiled
for sm_90 without a GPU.

    PYTHONPATH=. python benchmarks/sass_counts.py

Triton compiles each kernel for an H100/H200 target (`GPUTarget("cuda", 90, 32)`), with pointers
marked 16-byte aligned as the JIT specializes them at launch. nvdisasm from Triton's bundled CUDA
tools disassembles the cubin, and the script counts the instructions of the main loop: the
largest backward branch. Dividing by the weights one loop iteration of one thread handles gives
instructions per weight, the figure that showed the fp32 GEMV to be issue-bound (BENCHMARKS.md).
Use the triton version of the GPU image (3.6) for counts that match it.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import math
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gossamer.kernels import moe_mxfp4 as moe

H = INTER = 2880  # gpt-oss-120b
GATE_UP_ARGS = dict(x_ptr="*i32", x_unscale_ptr="*fp32", ids_ptr="*i32", words_ptr="*i32",
                    scales_ptr="*u8", bias_ptr="*bf16", act_ptr="*fp16", part_ptr="*fp32",
                    limit="fp32", alpha="fp32", scale_step="i32")  # fmt: skip
ROUTE_ARGS = dict(logits_ptr="*bf16", logits_stride="i32")  # the GEMV's own routing (ROUTE)
DOWN_ARGS = dict(act_ptr="*i32", ids_ptr="*i32", route_w_ptr="*fp32", words_ptr="*i32",
                 scales_ptr="*u8", bias_ptr="*bf16", out_ptr="*bf16", scale_step="i32")  # fmt: skip
OLD_GATE_UP_ARGS = dict(x_planes_ptr="*fp32", ids_ptr="*i32", words_ptr="*i32", scales_ptr="*u8",
                        bias_ptr="*bf16", act_ptr="*fp32", limit="fp32", alpha="fp32")  # fmt: skip
SCHEDULE_ARGS = dict(sorted_pairs_ptr="*i32", counts_ptr="*i32", offsets_ptr="*i32",
                     tile_ends_ptr="*i32")  # fmt: skip
GROUPED_GATE_UP_ARGS = dict(x_ptr="*bf16", **SCHEDULE_ARGS, w_ptr="*i32", scales_ptr="*u8",
                            bias_ptr="*bf16", act_ptr="*bf16", limit="fp32", alpha="fp32")  # fmt: skip
GROUPED_DOWN_ARGS = dict(act_ptr="*bf16", sorted_pairs_ptr="*i32", route_w_ptr="*fp32",
                         counts_ptr="*i32", offsets_ptr="*i32", tile_ends_ptr="*i32", w_ptr="*i32",
                         scales_ptr="*u8", bias_ptr="*bf16", y_ptr="*fp32")  # fmt: skip
V2_GATE_UP_ARGS = dict(scale_step="i32")
GROUPED_SHAPES = dict(H=H, INTER=INTER, E=128, E_P2=128, DOT_BF16=True, LANES=moe.LANES_BF16_PTX)


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int, maxnreg: int | None = None):
    # NOTE: constexprs left out would compile as None, not as their defaults (triton 3.6): an
    # `if NUM_STAGES == 0` then takes the other branch. Their defaults are filled in here.
    constexprs = _constexpr_defaults(fn) | constexprs
    names = list(fn.arg_names)
    aligned = {(names.index(k),): [["tt.divisibility", 16]] for k, v in signature.items()
               if v.startswith("*")}  # fmt: skip
    full = dict(signature) | {k: "constexpr" for k in constexprs}
    source = ASTSource(fn=fn, signature=full, constexprs=constexprs, attrs=aligned)
    target = GPUTarget("cuda", 90, 32)
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(source, target=target, options=options)


def _constexpr_defaults(fn) -> dict:
    parameters = inspect.signature(fn.fn).parameters.items()
    return {name: p.default for name, p in parameters
            if p.default is not p.empty and "constexpr" in str(p.annotation)}  # fmt: skip


def sass(compiled, *flags: str) -> str:
    """The compiled kernel's SASS, from nvdisasm (Triton's bundled CUDA tools); flags are extra
    nvdisasm options (sass_barriers.py: "-hex" for the encodings)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
        return subprocess.run([nvdisasm, "-c", *flags, path], capture_output=True, text=True).stdout


def loop_lines(text: str) -> list[str]:
    """The lines of the largest loop of a SASS listing: from a label to the last branch back to
    it."""
    lines = text.splitlines()
    labels = {
        m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\.L_x_\d+):", line))
    }
    best = (0, 0)
    for i, line in enumerate(lines):
        target = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", line)
        if (
            target
            and labels.get(target.group(1), i) < i
            and i - labels[target.group(1)] > best[1] - best[0]
        ):
            best = (labels[target.group(1)], i)
    return lines[best[0] : best[1] + 1]


def loop_histogram(compiled) -> collections.Counter:
    """Opcode counts of the largest loop (from a label to the last branch back to it)."""
    opcodes = collections.Counter()
    for line in loop_lines(sass(compiled)):
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            opcodes[m.group(1)] += 1
    return opcodes


# Shared-memory traffic, barriers, shuffles and tensor-core ops of a loop, printed apart from the
# most common opcodes: where a tile's data takes a detour (e.g. v2's weights through shared memory
# at BLOCK_M 8, where the MMA is mma.sync).
DATA_MOVES = ("LDGSTS", "LDS", "STS", "BAR", "SHFL", "HMMA", "HGMMA")


def shared_swizzles(ttgir: str) -> list[str]:
    """The swizzled shared-memory encodings a kernel's TTGIR declares, as "vec/perPhase/maxPhase"
    ("1/1/1": no swizzle). Session 27 found v2's activations losing theirs (16/1/4 -> 1/1/1)
    when permuted in registers after the load: fewer instructions, 21% slower (bank conflicts)."""
    pattern = (
        r"^#shared\w* = #ttg\.swizzled_shared<\{vec = (\d+), perPhase = (\d+), maxPhase = (\d+)"
    )
    return ["/".join(m.groups()) for m in re.finditer(pattern, ttgir, re.MULTILINE)]


def report(name: str, compiled, weights_per_thread: float) -> None:
    opcodes = loop_histogram(compiled)
    total = sum(opcodes.values())
    top = ", ".join(f"{op} {n}" for op, n in opcodes.most_common(8))
    moves = ", ".join(f"{op} {opcodes[op]}" for op in DATA_MOVES if opcodes[op])
    swizzles = ", ".join(shared_swizzles(compiled.asm["ttgir"]))
    print(f"{name:52s} {total:5d} per loop, {total / weights_per_thread:5.2f} per weight  ({top})"
          f"  [{moves}]  shared vec/perPhase/maxPhase: {swizzles or '-'}")  # fmt: skip


def grouped_v1(block_m: int) -> None:
    """The first grouped kernels (inline-PTX bf16 lanes, default configs)."""
    gu, dn = moe.GROUPED_GATE_UP, moe.GROUPED_DOWN
    shapes = GROUPED_SHAPES | dict(IS_MXFP4=True, BLOCK_M=block_m, SWAP_AB=True)
    kernel = compile_sm90(moe._grouped_gate_up_kernel, GROUPED_GATE_UP_ARGS,
                          shapes | dict(TOP_K=4, BLOCK_PAIRS=gu["BLOCK_PAIRS"],
                                        GROUPS_PER_STEP=gu["GROUPS_PER_STEP"]), gu["num_warps"])  # fmt: skip
    report(f"grouped v1 gate_up, BLOCK_M {block_m}", kernel,
           gu["BLOCK_PAIRS"] * 2 * gu["GROUPS_PER_STEP"] * 32 / (32 * gu["num_warps"]))  # fmt: skip
    kernel = compile_sm90(moe._grouped_down_kernel, GROUPED_DOWN_ARGS,
                          shapes | dict(BLOCK_COLS=dn["BLOCK_COLS"],
                                        GROUPS_PER_STEP=dn["GROUPS_PER_STEP"]), dn["num_warps"])  # fmt: skip
    report(f"grouped v1 down, BLOCK_M {block_m}", kernel,
           dn["BLOCK_COLS"] * dn["GROUPS_PER_STEP"] * 32 / (32 * dn["num_warps"]))  # fmt: skip


def v2_kernels(block_m: int, gu: dict, dn: dict) -> list[tuple[str, object]]:
    """The v2 kernels compiled for sm_90 at `block_m` rows with configs gu and dn:
    [("gate_up", compiled), ("down", compiled)]."""
    shapes = GROUPED_SHAPES | dict(BLOCK_M=block_m)
    gate_up = compile_sm90(moe._v2_gate_up_kernel, GROUPED_GATE_UP_ARGS | V2_GATE_UP_ARGS,
                           shapes | dict(TOP_K=4, DOWN_GROUPS=dn["GROUPS_PER_STEP"],
                                         X_WIDTH=moe._v2_padded(H, gu["GROUPS_PER_STEP"]),
                                         ACT_WIDTH=moe._v2_padded(INTER, dn["GROUPS_PER_STEP"]),
                                         NW=gu["num_warps"], **_constexprs(gu)), gu["num_warps"],
                           gu.get("maxnreg"))  # fmt: skip
    down = compile_sm90(moe._v2_down_kernel, GROUPED_DOWN_ARGS | dict(scale_step="i32"),
                        shapes | dict(X_WIDTH=moe._v2_padded(INTER, dn["GROUPS_PER_STEP"]),
                                      NW=dn["num_warps"], **_constexprs(dn)), dn["num_warps"],
                        dn.get("maxnreg"))  # fmt: skip
    return [("gate_up", gate_up), ("down", down)]


def grouped_v2(block_m: int, changes: dict) -> None:
    """The v2 kernels: default configs with `changes`; a thread handles 16 REP rows x a step."""
    name = "".join(f", {k} {v}" for k, v in changes.items())
    gu, dn = moe.GROUPED_V2_GATE_UP | changes, moe.GROUPED_V2_DOWN | changes
    for (kernel_name, compiled), config in zip(v2_kernels(block_m, gu, dn), (gu, dn), strict=True):
        report(f"grouped v2 {kernel_name}, BLOCK_M {block_m}{name}", compiled,
               16 * config["REP"] * config["GROUPS_PER_STEP"])  # fmt: skip


def _constexprs(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("num_warps", "maxnreg")}  # launch options


# 20b's routing inside the batch-1 gate_up GEMV (as the GPU runs it), with PDL
ROUTED = {"ROUTE": 1, "E": 32, "E_P2": 32, "K_P2": 4, "PDL": True}


def fp16_gate_up(changes: dict, gu: dict | None = None) -> tuple[object, float]:
    """The batch-1 gate_up GEMV at its tile `gu` (default: the default config's) with constexpr
    `changes` (ROUTED adds the routing's arguments): (compiled, weights a thread handles a loop)."""
    gu = gu or moe.DECODE_FP16_GATE_UP
    signature = GATE_UP_ARGS | (ROUTE_ARGS if changes.get("ROUTE") else {})
    kernel = compile_sm90(moe._fp16_gate_up_kernel, signature,
                          dict(H=H, INTER=INTER, TOP_K=4, ACT_EXP=10, SPLIT_K=gu["SPLIT_K"],
                               BLOCK_PAIRS=gu["BLOCK_PAIRS"], GROUPS_PER_STEP=gu["GROUPS_PER_STEP"],
                               **changes), gu["num_warps"])  # fmt: skip
    return kernel, gu["BLOCK_PAIRS"] * 2 * gu["GROUPS_PER_STEP"] * 32 / (32 * gu["num_warps"])


def fp16_down(changes: dict, dn: dict | None = None) -> tuple[object, float]:
    """The batch-1 down GEMV at its tile `dn` (default: the default config's) with constexpr
    `changes`: (compiled, weights a thread handles a loop)."""
    dn = dn or moe.DECODE_FP16_DOWN
    signature = DOWN_ARGS | (ROUTE_ARGS if changes.get("ROUTE") else {})
    kernel = compile_sm90(moe._fp16_down_kernel, signature,
                          dict(H=H, INTER=INTER, TOP_K=4, K_P2=4, ACT_EXP=10, SPLIT_K=dn["SPLIT_K"],
                               BLOCK_ROWS=dn["BLOCK_ROWS"], GROUPS_PER_STEP=dn["GROUPS_PER_STEP"],
                               AHEAD=dn.get("AHEAD", 0)) | changes, dn["num_warps"])  # fmt: skip
    return kernel, dn["BLOCK_ROWS"] * 4 * dn["GROUPS_PER_STEP"] * 32 / (32 * dn["num_warps"])


def word_layouts() -> None:
    """Each GPU bit layout (mxfp4.LANE_LAYOUTS) in the kernels that unpack it as the GPU runs
    them: the batch-1 GEMVs (fp16 lanes) and v2 at 8 rows (C=64's decode), 16 (C=256) and 64
    (prefill) (bf16 lanes)."""
    from gossamer.model import mxfp4

    for name in mxfp4.LANE_LAYOUTS:
        layout = moe.layout_code_of(name)
        report(f"{name}: fp16 gate_up (routing)", *fp16_gate_up({"LAYOUT": layout, **ROUTED}))
        report(f"{name}: fp16 down", *fp16_down({"LAYOUT": layout}))
        for block_m in (8, 16, 64):
            changes = moe.V2_TILE_CHANGES.get(block_m, {}) | {"LAYOUT": layout}
            if block_m == 8:
                changes |= {"SYNC": True}
            grouped_v2(block_m, changes)


def instructions_run(compiled, loop_trips: int) -> tuple[int, int]:
    """(instructions a thread runs: the kernel's outside its largest loop plus the loop's times
    loop_trips, registers a thread) of a compiled kernel. For kernels whose loop an unroll
    changes or removes (loop_trips 0: none left), where per-loop counts do not compare."""
    text = sass(compiled)
    count = _instruction_count(text.splitlines())
    loop = _instruction_count(loop_lines(text))
    return count - loop + loop * loop_trips, registers_of(text)


def registers_of(text: str) -> int:
    """Registers a thread of a SASS listing uses: its highest register number + 1."""
    return max(int(r) for r in re.findall(r"\bR(\d+)\b", text)) + 1


def _instruction_count(lines: list[str]) -> int:
    return sum(1 for line in lines if re.match(r"\s*/\*[0-9a-f]+\*/\s+\S", line))


def whole_steps() -> None:
    """The batch-1 GEMVs (120b, fp16 lanes, PDL) with WHOLE_STEPS n: whole steps unmasked, the
    loop unrolled n times (moe_mxfp4.DECODE_FP16_GATE_UP's comment). 90 groups in steps of 16:
    6 trips of the masked loop, 4 whole steps in the unrolled one (n >= 4: no loop left). Also
    gate_up with SCALES_T, and the GEMVs that route themselves (20b's, ROUTED; down without EARLY,
    as moe_from_logits runs it) as fusion_ab.py's whole_n_scales_t_routing would run them."""
    base = {"LAYOUT": moe.LAYOUT_FP16_LANES, "PDL": True}
    routed = ROUTED | {"EARLY": 0}
    for n in (0, 1, 2, 4):
        trips = 6 if n == 0 else 4 // n if n < 4 else 0
        steps = base | {"WHOLE_STEPS": n}
        kernels = (
            ("gate_up", fp16_gate_up(steps)[0]),
            ("gate_up SCALES_T", fp16_gate_up(steps | {"SCALES_T": 1})[0]),
            ("down", fp16_down(steps)[0]),
            ("routing gate_up SCALES_T", fp16_gate_up(steps | ROUTED | {"SCALES_T": 1})[0]),
            ("routing down", fp16_down(steps | routed)[0]),
        )
        for name, kernel in kernels:
            run, registers = instructions_run(kernel, trips)
            print(
                f"WHOLE_STEPS {n}: {name:24s} {run:5d} instructions a thread, {registers} registers"
            )


SMS = 132  # H100 SXM and H200 alike


def programs_per_sm(registers: int, num_warps: int) -> int:
    """Programs of `num_warps` warps an SM holds at `registers` a thread (allocated in units of 8
    a thread), at most 64 warps and 32 programs."""
    allocated = -(-registers // 8) * 8
    return min(65536 // (allocated * 32 * num_warps), 64 // num_warps, 32)


def tiles() -> None:
    """The batch-1 GEMVs' tiles that fusion_ab.py times in the graph (its GATE_UP_VARIANTS and
    DOWN_VARIANTS, and WHOLE_STEPS 4) as the defaults run them (120b, fp16 lanes, PDL, the whole-step
    loop where `_whole_steps` allows it): registers, programs an SM they allow, the grid at one
    token (top-4 experts) in waves over 132 SMs, and the instructions a thread runs over its whole
    row, a weight (the unrolled loop's trips are a constant: G // GROUPS_PER_STEP - 1 whole steps
    over WHOLE_STEPS; the masked loop's ceil(G / GROUPS_PER_STEP))."""
    import fusion_ab  # benchmarks/ is on the path when this file runs as a script

    groups = H // 32
    for kind, base, variants in (
        ("gate_up", moe.DECODE_FP16_GATE_UP, fusion_ab.GATE_UP_VARIANTS),
        ("down", moe.DECODE_FP16_DOWN, fusion_ab.DOWN_VARIANTS),
    ):
        for name, tile in {"defaults": {}, "whole_4": {"WHOLE_STEPS": 4}, **variants}.items():
            config = base | tile
            changes = {"LAYOUT": moe.LAYOUT_FP16_LANES, "PDL": True,
                       "WHOLE_STEPS": moe._whole_steps(config, True, groups),
                       "NUM_STAGES": config.get("NUM_STAGES", 0)}  # fmt: skip
            if kind == "gate_up":
                changes |= {"SCALES_T": config.get("SCALES_T", 0),
                            "PREFETCH_L2": config.get("PREFETCH_L2", 0),
                            **moe.prefetch_lines(config, groups)}  # fmt: skip
                compiled, weights = fp16_gate_up(changes, config)
                grid = 4 * INTER // config["BLOCK_PAIRS"]
            else:
                changes |= {"EARLY": config.get("EARLY", 0)}
                compiled, weights = fp16_down(changes, config)
                grid = H // config["BLOCK_ROWS"]
            unroll, steps = changes["WHOLE_STEPS"], groups / config["GROUPS_PER_STEP"]
            trips = (int(steps) - 1) // unroll if unroll else math.ceil(steps)
            run, registers = instructions_run(compiled, trips)
            per_sm = programs_per_sm(registers, config["num_warps"])
            print(f"{kind:7s} {name:17s} {registers:4d} registers, {per_sm:2d} programs an SM, "
                  f"{grid:5d} programs = {grid / (SMS * per_sm):4.2f} waves, WHOLE_STEPS "
                  f"{unroll}: {run:5d} instructions a thread, {run / (weights * steps):4.2f} a weight")  # fmt: skip


ATTENTION_ARGS = dict(
    q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", block_tables_ptr="*i32",
    query_start_loc_ptr="*i32", seq_lens_ptr="*i32", sinks_ptr="*fp32", tree_mask_ptr="*i32",
    out_ptr="*bf16", part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32",
    counter_ptr="*i32", k_new_ptr="*bf16", v_new_ptr="*bf16", positions_ptr="*i64",
    cos_sin_ptr="*fp32", slot_mapping_ptr="*i64", scale_log2="fp32", window="i32",
    num_splits="i32", min_chunk="i32", num_q_heads="i32",
    **dict.fromkeys(["stride_q_tok", "stride_q_head", "stride_o_tok", "stride_o_head",
                     "stride_c_block", "stride_c_tok", "stride_c_head", "stride_bt_seq",
                     "stride_bt_block", "stride_k_new_tok", "stride_k_new_head",
                     "stride_v_new_tok", "stride_v_new_head", "stride_cos_sin"], "i32"),
)  # fmt: skip


def attention_early_tile() -> None:
    """The decode attention launch at batch 64 (one split, gpt-oss heads, 64-key tiles, 4 warps,
    the one-tile prefetch) with and without the fused rope / KV write (ROPE_KV) and its first tile
    loaded before the PDL wait (EARLY_KV): registers, programs an SM, instructions."""
    from gossamer.kernels import attention

    for name, rope, early in (("plain", False, False), ("rope", True, False),
                              ("rope + early tile", True, True)):  # fmt: skip
        for sliding in (False, True):
            constexprs = dict(GROUP=8, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_Q=1, BLOCK_M=16,
                              BLOCK_N=attention.DECODE_BLOCK_N, SLIDING=sliding, SPLIT=False,
                              MERGE=False, SPLITS_P2=1, TREE=False, DOT_PRECISION="tf32",
                              ROPE_KV=rope, PDL=True, EARLY_KV=early, PREFETCH_NEXT=True)  # fmt: skip
            compiled = compile_sm90(attention._paged_attention_kernel, ATTENTION_ARGS, constexprs,
                                    attention.DECODE_NUM_WARPS)  # fmt: skip
            text = sass(compiled)
            registers = registers_of(text)
            per_sm = programs_per_sm(registers, attention.DECODE_NUM_WARPS)
            kind = "windowed" if sliding else "full"
            print(f"attention {name:18s} {kind:8s} {registers:4d} registers, {per_sm} programs an "
                  f"SM, {_instruction_count(text.splitlines()):5d} instructions")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-grouped", action="store_true", help="only the decode GEMVs")
    parser.add_argument("--layouts", action="store_true", help="only the word layouts compared")
    parser.add_argument("--whole-steps", action="store_true",
                        help="only the batch-1 GEMVs with WHOLE_STEPS 0, 1, 2, 4")  # fmt: skip
    parser.add_argument("--attention", action="store_true",
                        help="only decode attention's early first tile: registers")  # fmt: skip
    parser.add_argument("--tiles", action="store_true",
                        help="only the batch-1 GEMV tiles of fusion_ab.py: registers, waves")  # fmt: skip
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_90, gpt-oss-120b shapes; instructions per thread")
    if args.layouts:
        word_layouts()
        return
    if args.whole_steps:
        whole_steps()
        return
    if args.tiles:
        tiles()
        return
    if args.attention:
        attention_early_tile()
        return
    report("fp16 gate_up (default tile, masked loop)", *fp16_gate_up({}))
    # as the GPU runs it: the repacked bit layout, 20b's routing in the GEMV; SCALES_T off / on
    for scales_t in (0, 1):
        report(f"fp16 gate_up (fp16 lanes, routing, SCALES_T {scales_t})",
               *fp16_gate_up({"LAYOUT": moe.LAYOUT_FP16_LANES, "SCALES_T": scales_t, **ROUTED}))  # fmt: skip
    report("fp16 down (default tile, masked loop)", *fp16_down({}))
    old = moe.DECODE_GATE_UP
    kernel = compile_sm90(moe._decode_gate_up_kernel, OLD_GATE_UP_ARGS,
                          dict(H=H, INTER=INTER, TOP_K=4, PTX=False, BLOCK_PAIRS=old["BLOCK_PAIRS"],
                               GROUPS_PER_STEP=old["GROUPS_PER_STEP"]), old["num_warps"])  # fmt: skip
    report("fp32 gate_up (the first session's kernel)", kernel,
           old["BLOCK_PAIRS"] * 2 * old["GROUPS_PER_STEP"] * 32 / (32 * old["num_warps"]))  # fmt: skip
    if args.skip_grouped:
        return
    grouped_v1(16)
    # BLOCK_M 8 with V2_TILE_CHANGES[8]: v2's tile at 64 tokens of 120b (twice the mean pairs an
    # expert), the C=64 bar's decode steps; SYNC: its mma.sync K order (moe.V2_SYNC_ORDER, the
    # default since session 29: LAYOUT 1 with SYNC is what the GPU runs); LAYOUT 1: the words as
    # the GPU holds them (repacked at load, mxfp4.LAYOUT_FP16_LANES); maxnreg: registers a thread,
    # a launch option (moe.V2_TILE_CHANGES)
    eight = moe.V2_TILE_CHANGES[8]
    repacked = {"LAYOUT": moe.LAYOUT_FP16_LANES}
    sync = {"SYNC": True}
    v2_cases = [(8, eight | repacked), (8, eight | repacked | sync),
                (8, eight | repacked | sync | {"maxnreg": 64}), (16, repacked),
                (8, eight), (8, eight | {"NUM_STAGES": 2}), (8, eight | sync),
                (8, eight | sync | {"NUM_STAGES": 2}), (16, {}), (16, {"SCALE_PREFETCH": 0}),
                (16, {"REP": 2}), (32, {})]  # fmt: skip
    for block_m, changes in v2_cases:
        grouped_v2(block_m, changes)


if __name__ == "__main__":
    main()
