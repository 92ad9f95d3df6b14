"""A/B of the batch-1 decode fusions on one loaded model, interleaved to cancel drift.

    python benchmarks/fusion_ab.py [--models gpt-oss-120b] [--rounds 2] [--json PATH]

Variants (each a fresh ModelRunner with its start-up warm-up and CUDA graph; the weights load once):
  defaults     MXFP4 repacked for the fp16 GEMV (model/mxfp4.py LAYOUT_FP16_LANES), RoPE + KV
               write inside attention (attention.FUSE_ROPE_KV), the RMSNorms as their own launches
  no_rope      RoPE + KV write as its own launch
  no_layout    the published MXFP4 bit layout (the experts are repacked back in place)
  lanes_12_10 / lanes_13_9 / lanes_16_8  the MXFP4 words in another GPU layout (mxfp4.LANE_LAYOUTS:
               dearer fp16 unpacks for the batch-1 GEMVs, cheaper bf16 ones for v2)
  none         both off
  down_ahead0/2 the batch-1 MoE down GEMV without / with its scales and activation words loaded
               a step early (moe_mxfp4.DECODE_FP16_DOWN's AHEAD; the default 2; gate_up has none)
  down_early / down_late  down's first step of weight words and scales loaded before / after
               its PDL wait (DECODE_FP16_DOWN's EARLY)
  packed / no_packed  QKV and O read from / not from tile-packed copies of their weights
               (gemv.USE_PACKED, on by default; weights.pack_dense_for_gpu: each program's tiles
               one contiguous run);
               packed_<rows>x<cols>w<warps>p<programs an SM> the same on wider tiles (both)
  whole_1 / whole_2 / whole_4 / whole_gu4_dn2  the batch-1 MoE GEMVs' whole steps loaded without
               predicates, only the partial last step masked, the loop unrolled n times
               (DECODE_FP16_GATE_UP / _DOWN's WHOLE_STEPS; gu4_dn2: gate_up 4, down 2);
               whole_2_scales_t / whole_4_scales_t with gate_up's SCALES_T (whole_2_scales_t:
               the defaults since the thirty-seventh session); masked_steps both GEMVs on the
               masked loop, gate_up without SCALES_T (the defaults before). None of these
               reach the GEMVs that route themselves (20b): moe_mxfp4.ROUTING_GEMV_CHANGES;
               whole_2_scales_t_routing / whole_4_scales_t_routing reach them too
  gate_up_early / gate_up_late  the batch-1 MoE gate_up GEMV with / without its expert found
               from the router logits and its first words loaded before its PDL wait
               (DECODE_FP16_GATE_UP's EARLY)
  late_kv      decode attention loads its first key tile after the PDL wait (attention.EARLY_KV off)
  no_prefetch  decode attention's key loop without loading each tile an iteration ahead
               (attention.PREFETCH_NEXT_KV, on by default since the ninth session)
  split_128    at least 128 keys per split (attention.DECODE_MIN_SPLIT_KEYS, default 64): fewer
               splits to merge, each of two or more tiles that the prefetch overlaps
  ko_<part>    timing only, the step's tokens are wrong: one part of every layer left out of the
               graph (its output a fixed buffer or its input passed through), so that its
               difference from the defaults is that part's marginal cost inside the graph, with
               PDL and its neighbours as they run: ko_norms (both RMSNorms and the final one),
               ko_qkv, ko_attention (RoPE, KV write and attention), ko_o, ko_router (router
               GEMV: fixed logits), ko_experts (routing, gate_up and down), ko_expert_gemvs
               (the routing kept), ko_down (routing and gate_up kept), ko_unembed
  qkv_* / o_* / router_* / old_gemv  the batch-1 QKV, O or router GEMV on another tile
               (gemv.CONFIGS' tall_m1, medium_m1, narrow_m1; see GEMV_VARIANTS): qkv_fma and
               router_dot the defaults before 2026-12-04 (old_gemv both), *_k128 / *_s8 the
               tensor-core kernel's tiles 128 wide / 8 in flight, *_ppsmP its K split for about P
               programs an SM (default 8), *_whole_n1 the FMA kernel with
               one row a program and all of K in one tile, loaded before the PDL wait;
               qkv_pf_all / o_pf_all / dense_pf_all every W tile sent to L2 before the PDL wait
               (GemvConfig.prefetch 16 instead of 2); qkv_early / o_early / dense_early the
               tensor-core kernel's first W tile loaded before the PDL wait (GemvConfig.early);
               qkv_<rows>x<cols>w<warps>p<programs an SM> / o_... wider tensor-core tiles
               (WIDE_TILES); qkv_reduce / o_reduce the split partials added by a reduce
               kernel; qkv_whole_k_s8 no split, 8 tiles in flight (the default since the
               sixteenth session; qkv_split the split tile before it); qkv_whole_k_s6 / _s12
               (the default since the seventeenth) / _s16 its pipeline depth; o_whole_k_s8 /
               o_split2_s8 / o_split3_s6 O in 1-3 splits
  topk_keys    the routing kernel's top-k by packed int64 keys (moe_mxfp4.TOP_K_KEYS, its
               default since the seventeenth session); topk_two_reductions by two reductions a
               slot; route_in_all: the expert GEMVs route themselves at any expert count (120b)
  graph_131k   the graph captured for a 131k context (the server's max_model_len: 64 attention
               key splits at batch 1) instead of about the benchmark's context (16 at 1k), with
               no context-bucket graphs
  context_graphs  graph_131k with the context-bucket graphs (model_runner.CONTEXT_GRAPHS, the
               default since the twentieth session): the 1k step replays the graph captured for
               up to 1,984 keys (16 splits)
  greedy_in_graph / greedy_argmax  the greedy pick made inside the graph and read in place by
               the next step's embedding (model_runner.GREEDY_IN_GRAPH), or an argmax after the
               graph copied into the next step's input (the default before the twentieth session)
  advance_in_graph / no_advance  greedy_in_graph, and the graph moves its own inputs on so that
               the next step uploads nothing (model_runner.ADVANCE_IN_GRAPH; with the pick, the
               default since the twentieth session), or not
  unembed_triton / unembed_<rows>x<cols>w<warps>s<stages>  the batch-1 unembedding on the Triton
               GEMV (gemv.TRITON_UNEMBED, the default since the seventeenth session; huge_m1's
               tile, or the one named); unembed_cublas the cuBLAS one + cast kernel before it
  all_early    dense_early and gate_up_early together
  routing_kernel  the decode MoE with its routing launch between the router and gate_up (the
               default before 2026-12-04's fifteenth session; moe_mxfp4.ROUTE_IN_EXPERTS off).
               The knock-outs always run with it (they patch the ops that path calls)
  gate_up_scales_t  the batch-1 gate_up GEMV loading its scales through transposed pointers
               (DECODE_FP16_GATE_UP's SCALES_T: no accumulator trip through shared memory a step;
               on by default, with WHOLE_STEPS, since the thirty-seventh session)
  gu_* / dn_*  the batch-1 gate_up / down GEMV on another launch config (GATE_UP_VARIANTS,
               DOWN_VARIANTS: pairs or rows a program, warps, groups a step, pipeline stages)
  norm_w<N>    the RMSNorm kernel on N warps (norm.NUM_WARPS; by default 8 for hidden 2880)
Each variant is timed `--rounds` times in the order of VARIANTS; the
table gives the median ms per step, tok/s and the byte floor (decode_speed.step_bytes over the
copy bandwidth measured here).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import time
from dataclasses import replace

import torch
import triton
from decode_speed import BLOCK, make_seqs, step_bytes, timed_decode, timed_decode_fed
from timing import copy_bandwidth

from gossamer.kernels import attention, gemv, moe_mxfp4, norm
from gossamer.model import mxfp4
from gossamer.model.loader import load_model
from gossamer.model.weights import pack_dense_for_gpu, set_experts_layout
from gossamer.runner import model_runner
from gossamer.runner.model_runner import ModelRunner

# In this order, so that the experts are repacked twice per round (each repack of 120b's 57 GB of
# blocks takes a few seconds).
VARIANTS = {
    "defaults": {},
    "no_rope": {"fuse_rope": False},
    "no_layout": {"layout": mxfp4.LAYOUT_HF},
    **{name: {"layout": name} for name in mxfp4.LANE_LAYOUTS if name != mxfp4.LAYOUT_FP16_LANES},
    "none": {"layout": mxfp4.LAYOUT_HF, "fuse_rope": False},
    # AHEAD of the batch-1 MoE down GEMV: 2 loads each step's scales and activation words a step
    # early (the default), 0 does not
    "down_ahead0": {"down_ahead": 0},
    "down_ahead2": {"down_ahead": 2},
    "down_early": {"down_early": 1},
    "down_late": {"down_early": 0},
    "late_kv": {"early_kv": False},
    "no_prefetch": {"prefetch_next": False},
    "split_128": {"min_split_keys": 128},
    # QKV and O read from tile-packed copies (gemv.USE_PACKED; registered once per model)
    "packed": {"packed": True},
    "no_packed": {"packed": False},  # (the default since the fifteenth session is packed)
    # gate_up's EARLY: its expert from the router logits and its first words before the PDL wait
    "gate_up_early": {"gate_up": {"EARLY": 1}},
    "gate_up_late": {"gate_up": {"EARLY": 0}},
    # the scales through transposed pointers: no per-step trip of the accumulators through
    # shared memory (DECODE_FP16_GATE_UP's SCALES_T, session 18; default with WHOLE_STEPS since 37)
    "gate_up_scales_t": {"gate_up": {"SCALES_T": 1}},
    # both GEMVs' whole steps loaded without predicates, the loop unrolled 1, 2 or 4 times
    # (DECODE_FP16_GATE_UP / _DOWN's WHOLE_STEPS, session 37); whole_gu4_dn2 gate_up fully
    # unrolled, down twice; masked_steps the defaults before session 37
    **{
        f"whole_{n}": {"gate_up": {"WHOLE_STEPS": n}, "down_extra": {"WHOLE_STEPS": n}}
        for n in (1, 2, 4)
    },
    "whole_gu4_dn2": {"gate_up": {"WHOLE_STEPS": 4}, "down_extra": {"WHOLE_STEPS": 2}},
    "masked_steps": {
        "gate_up": {"WHOLE_STEPS": 0, "SCALES_T": 0},
        "down_extra": {"WHOLE_STEPS": 0},
    },
    # the same with gate_up's scales through transposed pointers (SCALES_T: no accumulator trip
    # through shared memory and no barrier a step; offline 1,743 instructions at n 4, 64 registers)
    **{
        f"whole_{n}_scales_t": {
            "gate_up": {"WHOLE_STEPS": n, "SCALES_T": 1},
            "down_extra": {"WHOLE_STEPS": n},
        }
        for n in (2, 4)
    },
    # the same reaching the GEMVs that route themselves too (20b; ROUTING_GEMV_CHANGES emptied)
    **{
        f"whole_{n}_scales_t_routing": {
            "gate_up": {"WHOLE_STEPS": n, "SCALES_T": 1},
            "down_extra": {"WHOLE_STEPS": n},
            "routing_gemv_changes": {},
        }
        for n in (2, 4)
    },
    "ko_norms": {"knockout": "norms"},
    "ko_qkv": {"knockout": "qkv"},
    "ko_attention": {"knockout": "attention"},
    "ko_o": {"knockout": "o"},
    "ko_router": {"knockout": "router"},
    "ko_experts": {"knockout": "experts"},
    "ko_expert_gemvs": {"knockout": "expert_gemvs"},
    "ko_down": {"knockout": "down"},
    "ko_unembed": {"knockout": "unembed"},
}
# Batch-1 GEMV tiles tried inside the graph (the sweeps in gemv_sweep.py time kernels alone).
_WHOLE = dict(kernel="fma", block_k=gemv.WHOLE_K, num_warps=4)
_QKV_FMA = gemv.GemvConfig(kernel="fma", block_n=4, block_k=512, num_warps=2, programs_per_sm=8)
# the batch-1 QKV / O tiles ("tall" / "medium": 16 x 64, one warp, split for 8 programs an SM) with
# one change. NOTE: QKV's default at batch 1 is "tall_m1" (unsplit) since the sixteenth session, so
# the qkv_* variants below are the split tile's, as they were measured
_QKV = functools.partial(replace, gemv.CONFIGS["tall"])
_O = functools.partial(replace, gemv.CONFIGS["medium"])
GEMV_VARIANTS = {
    # the batch-1 defaults before 2026-12-04: QKV on the FMA kernel, the router split along K
    "qkv_fma": {"tall_m1": _QKV_FMA},
    "router_dot": {"narrow_m1": gemv.CONFIGS["narrow"]},
    "old_gemv": {"tall_m1": _QKV_FMA, "narrow_m1": gemv.CONFIGS["narrow"]},
    # (these four as measured on 2026-12-04: 6 programs an SM, GemvConfig's default)
    "qkv_dot_k128": {"tall_m1": gemv.GemvConfig(block_n=16, block_k=128, num_warps=1)},
    "qkv_dot_s8": {"tall_m1": gemv.GemvConfig(block_n=16, num_warps=1, num_stages=8)},
    "qkv_ppsm4": {"tall_m1": _QKV(programs_per_sm=4)},
    "qkv_ppsm16": {"tall_m1": _QKV(programs_per_sm=16)},
    "o_ppsm4": {"medium_m1": _O(programs_per_sm=4)},
    "o_ppsm16": {"medium_m1": _O(programs_per_sm=16)},
    "o_whole_n1": {"medium_m1": gemv.GemvConfig(block_n=1, **_WHOLE)},
    "o_dot_k128": {"medium_m1": gemv.GemvConfig(block_n=16, block_k=128, num_warps=1)},
    "o_dot_s8": {"medium_m1": gemv.GemvConfig(block_n=16, num_warps=1, num_stages=8)},
    # every W tile of a program sent to L2 before the PDL wait (16 >= its tiles; default 2)
    "qkv_pf_all": {"tall_m1": _QKV(prefetch=16)},
    "o_pf_all": {"medium_m1": _O(prefetch=16)},
}
GEMV_VARIANTS["dense_pf_all"] = GEMV_VARIANTS["qkv_pf_all"] | GEMV_VARIANTS["o_pf_all"]
# the tensor-core kernel's first W tile loaded before the PDL wait (GemvConfig.early)
GEMV_VARIANTS |= {
    "qkv_early": {"tall_m1": _QKV(early=True)},
    "o_early": {"medium_m1": _O(early=True)},
}
GEMV_VARIANTS["dense_early"] = GEMV_VARIANTS["qkv_early"] | GEMV_VARIANTS["o_early"]
# the split partials added by a reduce kernel instead of the last program to arrive; no split
GEMV_VARIANTS |= {
    "qkv_reduce": {"tall_m1": _QKV(fixup="reduce")},
    "o_reduce": {"medium_m1": _O(fixup="reduce")},
    "qkv_whole_k_s8": {"tall_m1": _QKV(split_k=1, num_stages=8)},  # the sixteenth's default
    "qkv_split": {"tall_m1": gemv.CONFIGS["tall"]},  # the default before: split for 8 an SM
    # the unsplit QKV's pipeline depth (s12 the default since the seventeenth session: 20b -5 us
    # against s8, s6 +11); O with fewer splits (all slower)
    "qkv_whole_k_s6": {"tall_m1": _QKV(split_k=1, num_stages=6)},
    "qkv_whole_k_s12": {"tall_m1": _QKV(split_k=1, num_stages=12)},
    "qkv_whole_k_s16": {"tall_m1": _QKV(split_k=1, num_stages=16)},
    "o_whole_k_s8": {"medium_m1": _O(split_k=1, num_stages=8)},
    "o_split2_s8": {"medium_m1": _O(split_k=2, num_stages=8)},
    "o_split3_s6": {"medium_m1": _O(split_k=3, num_stages=6)},
}
# Wider programs (more warps, bigger tiles, fewer programs an SM) for QKV and O at batch 1:
# chain_floor.py's streaming chain ran fastest with 4 programs an SM of 8 warps and 16 KB tiles,
# where these GEMVs run 8 one-warp programs an SM with 2 KB tiles. Named <proj>_<rows>x<cols>
# w<warps>p<programs an SM>.
WIDE_TILES = [(32, 64, 2, 4), (64, 64, 4, 4), (64, 64, 4, 2), (32, 128, 4, 4), (64, 128, 4, 2),
              (128, 64, 8, 2)]  # fmt: skip
for _proj, _key in (("qkv", "tall_m1"), ("o", "medium_m1")):
    for _n, _k, _w, _p in WIDE_TILES:
        GEMV_VARIANTS[f"{_proj}_{_n}x{_k}w{_w}p{_p}"] = {
            _key: gemv.GemvConfig(block_n=_n, block_k=_k, num_warps=_w, programs_per_sm=_p)
        }
VARIANTS.update({name: {"gemv": configs} for name, configs in GEMV_VARIANTS.items()})
# Packed QKV and O on wider tiles (each its own packed copy): the streaming chain's best grid was
# 4 programs an SM of 8 warps with 16 KB tiles; row-major, wider tiles lost (WIDE_TILES).
PACKED_WIDE_TILES = [(64, 64, 4, 4), (64, 128, 4, 4), (128, 64, 8, 4), (64, 128, 8, 2)]
for _n, _k, _w, _p in PACKED_WIDE_TILES:
    _config = gemv.GemvConfig(block_n=_n, block_k=_k, num_warps=_w, programs_per_sm=_p)
    VARIANTS[f"packed_{_n}x{_k}w{_w}p{_p}"] = {
        "packed": True, "pack_tiles": [(_n, _k)],
        "gemv": {"tall_m1": _config, "medium_m1": _config},
    }  # fmt: skip
# The unembedding at batch 1 on the Triton GEMV (gemv.TRITON_UNEMBED: PDL, float32 logits stored
# directly) instead of cuBLAS + a cast kernel: the default tile (huge_m1) and others, named
# unembed_<rows>x<cols>w<warps>[s<stages>]
UNEMBED_TILES = [(64, 64, 4, 4), (16, 64, 1, 8), (64, 128, 8, 4), (32, 256, 4, 3), (16, 256, 2, 4)]
VARIANTS["unembed_triton"] = {"triton_unembed": True}
VARIANTS["unembed_cublas"] = {"triton_unembed": False}
for _n, _k, _w, _s in UNEMBED_TILES:
    VARIANTS[f"unembed_{_n}x{_k}w{_w}s{_s}"] = {
        "triton_unembed": True,
        "gemv": {"huge_m1": gemv.GemvConfig(block_n=_n, block_k=_k, split_k=1, num_warps=_w,
                                            num_stages=_s)},
    }  # fmt: skip
# The decode MoE with its routing kernel (the default until the fifteenth session), and batch-1
# expert GEMV and norm launch configs inside the graph (moe_decode_sweep.py timed them alone).
VARIANTS["routing_kernel"] = {"route_in_experts": False}
# The routing kernel's top-k by packed int64 keys (moe_mxfp4.TOP_K_KEYS: one reduction a slot
# instead of two) or not; route_in_all: routing in the expert GEMVs at 128 experts too (120b;
# ROUTE_IN_EXPERTS_MAX_EXPERTS 32 keeps it to 20b)
VARIANTS["topk_keys"] = {"topk_keys": True}
VARIANTS["topk_two_reductions"] = {"topk_keys": False}
VARIANTS["route_in_all"] = {"route_in_max_experts": 1 << 30}
# The step's greedy pick made in the graph and fed back in place (model_runner.GREEDY_IN_GRAPH,
# written in the seventeenth session, on since the twentieth), or an argmax after the graph and a
# copy
VARIANTS["greedy_in_graph"] = {"greedy_in_graph": True}
# The graph captured for a 131k context, as `gossamer serve` captures it (max_model_len): attention
# then launches 64 key splits at batch 1 where the benchmark's own graph has 16 at 1k context
VARIANTS["graph_131k"] = {"graph_max_len": 131072, "context_graphs": False}
# ... and with its context-bucket graphs (model_runner.CONTEXT_GRAPHS, on since the twentieth
# session): the step at the benchmark's context replays the bucket graph that launches its own
# split count
VARIANTS["context_graphs"] = {"graph_max_len": 131072, "context_graphs": True}
VARIANTS["greedy_argmax"] = {"greedy_in_graph": False}
# ... and the inputs advanced in the graph (model_runner.ADVANCE_IN_GRAPH, nineteenth session, on
# since the twentieth): the fed step then uploads nothing; no_advance: the pick alone
VARIANTS["advance_in_graph"] = {"greedy_in_graph": True, "advance_in_graph": True}
VARIANTS["no_advance"] = {"greedy_in_graph": True, "advance_in_graph": False}
GATE_UP_VARIANTS = {
    "gu_p8w2": {"BLOCK_PAIRS": 8, "num_warps": 2},
    "gu_p8w4": {"BLOCK_PAIRS": 8, "num_warps": 4},
    "gu_p16w2": {"BLOCK_PAIRS": 16, "num_warps": 2},
    "gu_p32w8": {"BLOCK_PAIRS": 32, "num_warps": 8},
    "gu_g8": {"GROUPS_PER_STEP": 8},
    "gu_g32": {"GROUPS_PER_STEP": 32},
    "gu_s3": {"NUM_STAGES": 3},
    # each program's rows asked into L2 as it starts (moe_mxfp4.GATE_UP_PREFETCH_L2): the
    # scales, or the scales and the words
    "gu_l2_scales": {"PREFETCH_L2": 1},
    "gu_l2_words": {"PREFETCH_L2": 2},
}
DOWN_VARIANTS = {
    "dn_r2w1": {"BLOCK_ROWS": 2},
    "dn_r2w2": {"BLOCK_ROWS": 2, "num_warps": 2},
    "dn_w2": {"num_warps": 2},
    "dn_r4w4": {"BLOCK_ROWS": 4, "num_warps": 4},
    "dn_g8": {"GROUPS_PER_STEP": 8},
    "dn_g32": {"GROUPS_PER_STEP": 32},
}
VARIANTS.update({name: {"gate_up": config} for name, config in GATE_UP_VARIANTS.items()})
VARIANTS.update({name: {"down_extra": config} for name, config in DOWN_VARIANTS.items()})
VARIANTS.update({f"norm_w{warps}": {"norm_warps": warps} for warps in (2, 4, 16)})
VARIANTS["all_early"] = {
    "gemv": GEMV_VARIANTS["dense_early"],
    "gate_up": {"EARLY": 1},
}
PATCHED_OPS = ("rms_norm", "linear", "logits", "rope_write_kv_attention", "moe")


def _routed_only(moe, with_gate_up: bool, x, logits, experts, top_k, limit, alpha):
    """A 1-token MoE call that launches the batch-1 routing (and gate_up) but not the rest; it
    returns x, so later layers see finite values (their routing stays in range)."""
    if x.shape[0] != 1 or not moe_mxfp4.DECODE_FP16:
        return moe(x, logits, experts, top_k, limit, alpha)
    ids, _, x_h, x_unscale = moe_mxfp4.route_fp16(logits, top_k, x.contiguous())
    if with_gate_up:
        inter = experts.gate_up_bias.shape[-1] // 2
        moe_mxfp4._fp16_gate_up(x_h, x_unscale, ids, experts, inter, top_k, limit, alpha,
                                moe_mxfp4.act_exponent(limit), moe_mxfp4.DECODE_FP16_GATE_UP,
                                logits)  # fmt: skip
    return x


def knock_out(model, part: str | None) -> None:
    """Patch (or with None restore) the model's shared ops object so that 1-token calls of `part`
    launch nothing: a projection returns a fixed random buffer of its output's shape, the norms
    and the experts return their input, attention returns q. Other token counts (prefill, the
    warm-up's shapes) run the real op. Timing only: the tokens decoded are not the model's."""
    ops = model.ops
    for name in PATCHED_OPS:
        ops.__dict__.pop(name, None)
    if part is None:
        return
    cfg, real = model.config, {name: getattr(ops, name) for name in PATCHED_OPS}
    rows = {"qkv": cfg.q_size + 2 * cfg.kv_size, "o": cfg.hidden_size,
            "router": cfg.num_local_experts, "unembed": cfg.vocab_size}  # fmt: skip
    if part in rows:
        wanted = rows[part]
        fixed = torch.randn(1, wanted, device=model.device).to(model.dtype)

        def linear(x, weight, bias):
            in_features = cfg.q_size if part == "o" else cfg.hidden_size
            if x.shape[0] == 1 and weight.shape == (wanted, in_features):
                return fixed
            return real["linear"](x, weight, bias)

        ops.linear = linear
        # the unembedding comes through ops.logits (linear, then float32)
        # NOTE: with the greedy pick in the graph (greedy_out / advance given) the unembedding
        # stays: the next step's input comes from it, so ko_unembed times the defaults there
        ops.logits = lambda hidden, weight, *pick: (
            linear(hidden, weight, None).float()
            if weight.shape == (wanted, cfg.hidden_size) and not any(a is not None for a in pick)
            else real["logits"](hidden, weight, *pick)
        )
    elif part == "norms":
        ops.rms_norm = lambda x, weight, eps, residual=None: (
            (x, x if residual is None else residual)
            if x.shape[0] == 1
            else real["rms_norm"](x, weight, eps, residual)
        )
    elif part == "attention":
        ops.rope_write_kv_attention = lambda q, *args: (
            q if q.shape[0] == 1 else real["rope_write_kv_attention"](q, *args)
        )
    elif part == "experts":
        ops.moe = lambda x, *args: x if x.shape[0] == 1 else real["moe"](x, *args)
    elif part in ("expert_gemvs", "down"):
        ops.moe = functools.partial(_routed_only, real["moe"], part == "down")
    else:
        raise ValueError(f"unknown knock-out {part!r}")


def apply(model, variant: dict, defaults: dict) -> None:
    set_experts_layout(model, variant.get("layout", mxfp4.gpu_layout()))
    attention.FUSE_ROPE_KV = variant.get("fuse_rope", defaults["fuse_rope"])
    attention.EARLY_KV = variant.get("early_kv", defaults["early_kv"])
    attention.PREFETCH_NEXT_KV = variant.get("prefetch_next", defaults["prefetch_next"])
    attention.DECODE_MIN_SPLIT_KEYS = variant.get("min_split_keys", defaults["min_split_keys"])
    # the knock-outs patch ops.moe and ops.rms_norm, which only the path with the routing kernel
    # calls
    route_default = defaults["route_in_experts"] and "knockout" not in variant
    moe_mxfp4.ROUTE_IN_EXPERTS = variant.get("route_in_experts", route_default)
    norm.NUM_WARPS = variant.get("norm_warps", defaults["norm_warps"])
    gemv.TRITON_UNEMBED = variant.get("triton_unembed", defaults["triton_unembed"])
    moe_mxfp4.TOP_K_KEYS = variant.get("topk_keys", defaults["topk_keys"])
    model_runner.GREEDY_IN_GRAPH = variant.get("greedy_in_graph", defaults["greedy_in_graph"])
    model_runner.CONTEXT_GRAPHS = variant.get("context_graphs", defaults["context_graphs"])
    model_runner.ADVANCE_IN_GRAPH = variant.get("advance_in_graph", defaults["advance_in_graph"])
    moe_mxfp4.ROUTE_IN_EXPERTS_MAX_EXPERTS = variant.get(
        "route_in_max_experts", defaults["route_in_max_experts"]
    )
    down_ahead = variant.get("down_ahead", defaults["down_ahead"])
    early = variant.get("down_early", defaults["down"].get("EARLY", 0)) if down_ahead == 2 else 0
    moe_mxfp4.DECODE_FP16_DOWN = (defaults["down"] | {"AHEAD": down_ahead, "EARLY": early}
                                  | variant.get("down_extra", {}))  # fmt: skip
    moe_mxfp4.DECODE_FP16_GATE_UP = defaults["gate_up"] | variant.get("gate_up", {})
    moe_mxfp4.ROUTING_GEMV_CHANGES = variant.get(
        "routing_gemv_changes", defaults["routing_gemv_changes"]
    )
    knock_out(model, variant.get("knockout"))
    gemv.USE_PACKED = variant.get("packed", defaults["packed"])
    gemv.CONFIGS = defaults["gemv"] | variant.get("gemv", {})
    gemv.plan_gemv.cache_clear()  # plans of the default configs are cached by shape


def time_variant(model, context: int, steps: int, graph_max_len: int | None = None) -> float:
    runner, seqs = make_runner(model, context, steps, graph_max_len)
    seconds = timed_decode(runner, seqs, steps)
    del runner
    torch.cuda.empty_cache()
    return seconds


def make_runner(model, context: int, tokens: int, graph_max_len: int | None = None):
    """A batch-1 runner with its graph (captured under the module switches as they are now) and a
    sequence at `context` with room for `tokens` more. `graph_max_len`: the context the graph is
    captured for, as a server's graphs are for its max_model_len (attention sizes its key splits
    by it); by default the model's, which bench() loads at about the benchmark's context."""
    saved = model.max_model_len
    model.max_model_len = graph_max_len or saved
    try:
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
    finally:
        model.max_model_len = saved
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
        runners[variant] = make_runner(model, args.context, args.rounds * (args.steps + 3),
                                       VARIANTS[variant].get("graph_max_len"))  # fmt: skip
    apply(model, {}, defaults)
    times = {v: [] for v in chosen}
    for _ in range(args.rounds):
        for variant, (runner, seqs) in runners.items():
            timer = timed_decode_fed if args.fed else timed_decode
            times[variant].append(timer(runner, seqs, args.steps))
    print(" ".join(f"{v} {1e3 * statistics.median(t):.3f}" for v, t in times.items()), flush=True)
    return times


def current_defaults() -> dict:
    """The module switches and configs that `apply` sets, as they are now (the defaults)."""
    return {"fuse_rope": attention.FUSE_ROPE_KV,
            "early_kv": attention.EARLY_KV, "prefetch_next": attention.PREFETCH_NEXT_KV,
            "min_split_keys": attention.DECODE_MIN_SPLIT_KEYS,
            "down": moe_mxfp4.DECODE_FP16_DOWN, "gemv": dict(gemv.CONFIGS),
            "gate_up": moe_mxfp4.DECODE_FP16_GATE_UP, "packed": gemv.USE_PACKED,
            "route_in_experts": moe_mxfp4.ROUTE_IN_EXPERTS, "norm_warps": norm.NUM_WARPS,
            "triton_unembed": gemv.TRITON_UNEMBED,
            "topk_keys": moe_mxfp4.TOP_K_KEYS,
            "greedy_in_graph": model_runner.GREEDY_IN_GRAPH,
            "context_graphs": model_runner.CONTEXT_GRAPHS,
            "advance_in_graph": model_runner.ADVANCE_IN_GRAPH,
            "route_in_max_experts": moe_mxfp4.ROUTE_IN_EXPERTS_MAX_EXPERTS,
            "down_ahead": moe_mxfp4.DECODE_FP16_DOWN.get("AHEAD", 0),
            "routing_gemv_changes": moe_mxfp4.ROUTING_GEMV_CHANGES}  # fmt: skip


def bench(name: str, args: argparse.Namespace, bandwidth: float) -> list[dict]:
    grown = args.rounds * (args.steps + 3) if args.interleave else args.steps  # tokens decoded
    loaded = load_model(
        name, load_format="dummy", device="cuda", max_model_len=args.context + grown + 32
    )
    model, cfg = loaded.model, loaded.config
    defaults = current_defaults()
    chosen = args.variants.split(",") if args.variants else list(VARIANTS)
    if any(VARIANTS[v].get("packed") for v in chosen):
        gemv.clear_packed()  # a previous model's
        tiles = {tuple(t) for v in chosen for t in VARIANTS[v].get("pack_tiles", [])}
        print(f"{pack_dense_for_gpu(model, tuple(sorted(tiles)))} packed copies of QKV / O weights")
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
            seconds = time_variant(model, args.context, args.steps,
                                   VARIANTS[variant].get("graph_max_len"))  # fmt: skip
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
