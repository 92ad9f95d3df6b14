"""Linear layers for decode-sized batches: y[M, N] = x[M, K] @ W[N, K].T + bias, M = 1..64.

At decode a dense projection is bound by reading W once (gpt-oss-120b per layer: QKV 29.5 MB,
O 23.6 MB, router 0.74 MB), so what matters is how many bytes each SM keeps in flight, that every SM
gets the same share, and few instructions per weight byte. Two kernels, both reading W once for all
M rows of x:

* `_gemv_dot_kernel` (any M): the tile is W[BLOCK_N, BLOCK_K] @ x^T[BLOCK_K, BLOCK_M] on the tensor
  cores, W as the "row" operand so that M = 1..8 tokens fit one 8-wide MMA column tile. `num_stages`
  lets Triton stream the W and x tiles through shared memory with asynchronous copies (16 bytes a
  thread for W), num_stages - 1 tiles ahead; its loop is 9-12 instructions per 16 bytes of W per
  thread (sm_90 SASS), whatever M is.
* `_gemv_fma_kernel` (M == 1): 16-byte register loads of W, fp32 multiply-adds, the next tile loaded
  into registers before the current one is used (double buffering). About 40 instructions per 16
  bytes of W (the bf16 -> fp32 conversions cost as much as the multiply-adds), so M == 1 only.

A row block of W is too little work for the whole GPU on these shapes (the router has 128 rows), so
K is split over `split_k` programs that write float32 partial sums. They are added in split order
(deterministic) either by the last program of a row block to arrive, found with an atomic counter
("last": no second launch), or by `_reduce_splits_kernel` ("reduce"). Both add the bias and cast.

Tiles come from `CONFIGS`, one per shape class picked by `shape_class`; `gemv(..., config=...)`
overrides them (benchmarks/gemv_sweep.py sweeps them). Above GEMV_MAX_M rows `linear` uses cuBLAS,
except for the shape classes in CLASS_MAX_M, which the kernels serve further (the router to 64 rows).
The pure-torch twin is torch.nn.functional.linear. `logits` (the unembedding) asks for a float32
output: the kernels round to x's dtype and store the widened values (ROUND_OUT), which is
linear(...).float() without the cast kernel. Asked for each row's argmax too (`greedy_out`: the
runner's greedy pick inside the decode graph), an unsplit dot-kernel launch makes it in its
epilogue (GREEDY: each program's best (value, row) packed into one int64 key, one atomic max a
program, and the last program to arrive writes the row); any other path runs torch.argmax after.
With `advance` (ops.base.DecodeAdvance) that last program also moves the step's inputs on by a
token (ADVANCE), so the runner need not upload the next step's; elsewhere torch ops do it after.

Tile-packed weights (`USE_PACKED`, on by default; GOSSAMER_PACKED_GEMV=0 turns them off):
`register_packed` keeps a copy of W in which each BLOCK_N x BLOCK_K tile is one contiguous run and a
row block's tiles follow each other in K order (`pack_tiles`), so that each program of a split reads
one run instead of BLOCK_N rows' 128-byte pieces (benchmarks/chain_floor.py: that read pattern costs ~0.12 ms a 20b
batch-1 step). A dot-kernel plan with the copy's tile reads it (PACKED constexpr); cuBLAS and other
tiles read W.

The residual add + RMSNorm that feeds a projection runs as its own kernel (kernels/norm.py).
Folded into the GEMV's prologue (every program reading the whole rows for their 1/rms before its
first weight tile) it was slower at batch 1 (H200, sessions 4 and 17, fusion_ab.py: 120b 2.51 ->
2.67 ms a step, 20b 1.448 -> 1.805; in the whole-row router only, 20b 1.505 -> 1.515) and was
removed in session 36.
"""

from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gossamer.kernels import pdl
from gossamer.kernels.keys import NO_KEY, key_index, value_key
from gossamer.ops.base import DecodeAdvance

# Largest M served by the Triton kernels; above it, cuBLAS. Measured on the H200 (2026-12-02,
# benchmarks/gemv_sweep.py): with the configs below they beat cuBLAS on QKV, O and the router at
# M = 1 and 4 (O 8.9 vs 11.4 us, router 3.5 vs 6.2 us, QKV 10.2 vs 10.5 us at M = 1) but not on
# QKV at M = 8 (10.75 vs 10.46 us). The third session's sweep (with PDL) measured M = 8 faster too:
# QKV 10.33 vs 10.52 us, O 8.84 vs 11.51, router 2.63 vs 6.28 (a 1 + 7 verification step).
# (GOSSAMER_GEMV_MAX_M: every class up to that many rows, for A/B runs.)
GEMV_MAX_M = int(os.environ.get("GOSSAMER_GEMV_MAX_M", "8"))
MAX_ROWS = 64  # most x rows one call serves (the MMA column tile grows to 64)
WIDE_FROM = 9  # from this many rows a shape class takes its "_wide" config, where it has one
# Classes served past GEMV_MAX_M, on their "_wide" tiles. Measured on an H100 (2026-12-06,
# gemv_sweep.py --wide, 120b shapes, graphs of back-to-back calls, us, cuBLAS in brackets):
# the router at 16 / 32 / 64 rows 2.81 / 3.00 / 3.55 (6.70 / 6.80 / 6.80: cuBLAS splits K and
# adds a reduce kernel); O 12.31 / 13.61 (14.16 / 14.33) at 16 / 32 rows but 14.94 (11.85) at 64.
# QKV lost at every width (14.5-17.0 against 13.1-13.7): cuBLAS keeps it. With all three classes
# here up to 64 rows, the batch-64 step of 120b (H100, throughput.py at C=64) took 27.47 ms
# against 27.24 with cuBLAS: QKV's and O's losses outweigh the router's gain.
# (GOSSAMER_GEMV_WIDE=0: cuBLAS past GEMV_MAX_M for every class, for A/B runs.)
CLASS_MAX_M = (
    {"narrow": 64, "medium": 32} if os.environ.get("GOSSAMER_GEMV_WIDE", "1") == "1" else {}
)
MAX_SPLITS = 64  # the fix-ups unroll their sum over the splits
COUNTER_SLOTS = 8192  # row blocks the "last" fix-up can count; more fall back to "reduce"
NO_SPLIT, SPLIT_REDUCE, SPLIT_LAST = 0, 1, 2  # how a kernel finishes (SPLIT constexpr)


@dataclass(frozen=True)
class GemvConfig:
    """Launch config of one problem. `split_k=None` picks the split from the grid size."""

    kernel: str = "dot"  # "dot" (tensor cores, any M) or "fma" (M == 1; others fall back to dot)
    block_n: int = 32  # rows of W per program
    block_k: int = 64  # columns of W per step
    split_k: int | None = None  # programs sharing one row block's K range
    fixup: str = "last"  # who adds the split partials: the "last" program, or a "reduce" kernel
    num_warps: int = 2
    num_stages: int = 4  # W tiles in flight per program (dot kernel)
    programs_per_sm: int = 6  # target of the automatic split
    prefetch: int = 2  # W tiles per program sent to L2 before the PDL wait (dot kernel)
    # the dot kernel's first W tile loaded before the PDL wait (the FMA kernel's always is); off:
    # no gain in the graph (H200, 2026-12-04, fusion_ab.py dense_early: 20b 1.506 -> 1.507 ms)
    early: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in ("dot", "fma") or self.fixup not in ("last", "reduce"):
            raise ValueError(f"unknown kernel or fixup in {self}")


WHOLE_K = 0  # GemvConfig.block_k: one tile of every column (the next power of two), no split

# Defaults per shape class; "<class>_m1", where present, serves M == 1. "medium" is the sweep's
# best over QKV and O at M = 1, 4 and 8 (benchmarks/gemv_sweep.py on the H200, 2026-12-02);
# "narrow" (the router) kept its first guess, which the sweep measured best too. The batch-1
# choices were then measured inside the decode step's CUDA graph (benchmarks/fusion_ab.py, H200,
# 2026-12-04, gpt-oss-20b, interleaved), where they differ from the kernels timed alone.
CONFIGS: dict[str, GemvConfig] = {
    # router (N = 32..128): few rows, so many K splits of 3 tiles each, all in flight at once
    "narrow": GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=1),
    # the router at M == 1: a program per row with its whole row loaded before the PDL wait, no
    # split partials to add up (in the graph 1.561 -> 1.533 ms a 20b step)
    "narrow_m1": GemvConfig(kernel="fma", block_n=1, block_k=WHOLE_K, num_warps=4),
    # QKV, O and the like: narrow row blocks, split so that every SM holds about 8 programs
    "medium": GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=8),
    # QKV-like (more outputs than inputs), also at M == 1: alone, the FMA kernel's 4 rows x 1 KB
    # steps were faster (third session: 9.03 us against 10.03), but in the graph this one is
    # (1.561 -> 1.542 ms a 20b step): its ~960 one-warp programs all fit on the GPU at once, the
    # FMA kernel's 1,280 did not (124 registers a thread: 8 programs an SM)
    "tall": GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=8),
    # QKV at M == 1 unsplit (320 programs of 45 tiles, 12 in flight): no split partials or last-
    # program fixup. In the graph (H200, fusion_ab.py, fed, 5 rounds, 2026-12-04): unsplit 8 deep
    # against the split tile -6.6 us a step on 20b, -12.6 on 120b; then 12 deep against 8 -5.4
    # us on 20b (6 deep +11; 120b not measured at 12)
    "tall_m1": GemvConfig(block_n=16, block_k=64, num_warps=1, split_k=1, num_stages=12),
    # unembedding-sized: thousands of row blocks already fill the GPU
    "huge": GemvConfig(block_n=64, block_k=64, split_k=1, num_warps=4),
    # WIDE_FROM..64 rows (CLASS_MAX_M), the sweep's best (H100, gemv_sweep.py --wide): the router
    # split 15 ways with a reduce launch (the "last" fixup's partial reads cost more at 16+ rows:
    # 3.28 / 4.54 / 6.65 us at 16 / 32 / 64); O on 32-row blocks, 2 warps
    "narrow_wide": GemvConfig(
        block_n=32, block_k=64, num_warps=2, programs_per_sm=1, fixup="reduce"
    ),
    "medium_wide": GemvConfig(block_n=32, block_k=64, num_warps=2, programs_per_sm=4),
    # QKV (cuBLAS serves it past GEMV_MAX_M; the sweep's least total time over 16..64 rows)
    "tall_wide": GemvConfig(block_n=64, block_k=64, num_warps=4, split_k=1),
    # the unembedding at M == 1 (TRITON_UNEMBED): 32 rows x 256 bytes (8 KB) a step, 4 in flight.
    # In the graph (H200, fusion_ab.py, fed, 2026-12-04, 5 rounds) five other tiles were no faster
    # (16x64w1s8, 32x256w4s3 and 16x256w2s4 within 1.5 us of it, 64x64w4s4 +8 us)
    "huge_m1": GemvConfig(block_n=32, block_k=128, split_k=1, num_warps=4),
}


# Shape classes `linear` sends to Triton: cuBLAS already streams the unembedding at the copy
# bandwidth (kernels_small.py: 266.9 us on the H200), so "huge" stays there unless measured faster.
TRITON_CLASSES = ("narrow", "medium", "tall")
# ...but in the batch-1 graph the unembedding's marginal cost is 279 us (20b, session 13's
# knock-outs) where a streaming kernel reads its 1.16 GB in 255 us (chain_floor.py), and cuBLAS
# neither overlaps the norm before it (no PDL) nor writes the float32 logits (a cast kernel
# follows). So "huge" at M == 1 runs here on CONFIGS["huge_m1"]: in the graph (H200, fusion_ab.py
# unembed_triton, fed, 2026-12-04, faster in 5 of 5 rounds) 20b -17 us a step, 120b -8 us.
# (env: A/B runs; GOSSAMER_TRITON_UNEMBED=0 is cuBLAS)
TRITON_UNEMBED = os.environ.get("GOSSAMER_TRITON_UNEMBED", "1") == "1"


def shape_class(out_features: int, in_features: int) -> str:
    if out_features <= 512:
        return "narrow"
    if out_features * in_features >= (1 << 27):
        return "huge"
    return "tall" if out_features > in_features else "medium"


def default_config(num_tokens: int, out_features: int, in_features: int) -> GemvConfig:
    name = shape_class(out_features, in_features)
    if num_tokens == 1:
        return CONFIGS.get(f"{name}_m1", CONFIGS[name])
    if num_tokens >= WIDE_FROM:
        return CONFIGS.get(f"{name}_wide", CONFIGS[name])
    return CONFIGS[name]


def max_rows(name: str) -> int:
    """The most rows `linear` sends to the kernels for shape class `name` (0: never)."""
    if name in TRITON_CLASSES:
        return max(GEMV_MAX_M, CLASS_MAX_M.get(name, 0))
    return 1 if name == "huge" and TRITON_UNEMBED else 0


def launch_key(num_tokens: int) -> tuple:
    """What selects the Triton binaries `linear` runs at this many rows: per shape class whether
    the kernels serve it, then the config (M == 1, wide or not), BLOCK_M (a function of
    next_power_of_2(M) and the config) and Triton's integer specialization of M (1, a multiple of
    16, or neither). The warm-up (runner/warmup.py) runs a step at the first count of each key."""
    served = tuple(num_tokens <= max_rows(name) for name in (*TRITON_CLASSES, "huge"))
    if num_tokens < 1 or not any(served):
        return ()
    wide = num_tokens >= WIDE_FROM
    pow2 = triton.next_power_of_2(num_tokens)
    return (served, num_tokens == 1, wide, pow2, num_tokens % 16 == 0)


@dataclass(frozen=True)
class GemvPlan:
    """A config resolved against one shape: a pure function of the shape (graph-capture safe)."""

    config: GemvConfig
    block_m: int  # x rows per tile (a power of two >= M; extra rows repeat the last)
    split_k: int
    k_per_split: int  # columns per split, a multiple of block_k
    row_blocks: int


@functools.lru_cache(maxsize=512)
def plan_gemv(
    num_tokens: int,
    out_features: int,
    in_features: int,
    num_sms: int,
    config: GemvConfig | None = None,
) -> GemvPlan:
    if config is None:
        config = default_config(num_tokens, out_features, in_features)
    if config.kernel == "fma" and num_tokens != 1:
        config = replace(config, kernel="dot")  # FMA costs M multiply-adds per weight: M == 1 only
    if config.block_k == WHOLE_K:
        config = replace(config, block_k=max(64, triton.next_power_of_2(in_features)), split_k=1)
    row_blocks = triton.cdiv(out_features, config.block_n)
    k_blocks = triton.cdiv(in_features, config.block_k)
    split_k = config.split_k
    if split_k is None:
        wanted = triton.cdiv(config.programs_per_sm * num_sms, row_blocks)
        split_k = min(wanted, k_blocks // 2)  # a split reads >= 2 tiles, so loads overlap
    split_k = max(1, min(split_k, k_blocks, MAX_SPLITS))
    blocks_per_split = triton.cdiv(k_blocks, split_k)
    split_k = triton.cdiv(k_blocks, blocks_per_split)  # drop splits that would get no columns
    # NOTE: at least 4 bytes of the x tile per thread: narrower loads cannot be asynchronous copies,
    # and a synchronous x load in the loop would wait for the L2 every step
    block_m = max(triton.next_power_of_2(num_tokens), 64 * config.num_warps // config.block_k, 1)
    return GemvPlan(config, block_m, split_k, blocks_per_split * config.block_k, row_blocks)


def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` sends x [..., K] @ weight[N, K].T to the Triton kernels (else cuBLAS)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or x.dtype != weight.dtype:
        return False
    return rows <= max_rows(shape_class(*weight.shape))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T + bias -> [..., N]: Triton where `serves`, else cuBLAS."""
    if not serves(x, weight):
        return F.linear(x, weight, bias)
    return gemv(x, weight, bias)


def logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    greedy_out: torch.Tensor | None = None,
    advance: DecodeAdvance | None = None,
) -> torch.Tensor:
    """linear(hidden, weight, None).float() (the unembedding), in one launch where the Triton GEMV
    serves it: its float32 store holds the values rounded to hidden's dtype, so no cast kernel.
    `greedy_out` ([T] int64): also each row's argmax, as torch.argmax picks it (the first index
    of the largest value), which the GEMV's programs find with one atomic max each where they can
    (`_greedy_pick`; the runner's in-graph greedy pick) and an argmax kernel finds elsewhere.
    `advance` (with greedy_out): the step's inputs moved on by a token, by the program that
    writes the picks where the GEMV picks, else by torch ops (DecodeAdvance.apply)."""
    picked = False
    if serves(hidden, weight):
        out, picked = _gemv(hidden, weight, None, None, torch.float32, greedy_out, advance)
    else:
        out = linear(hidden, weight, None).float()
    if greedy_out is not None and not picked:
        greedy_out.copy_(out.argmax(dim=-1))
    if advance is not None and not picked:
        advance.apply()
    return out


def gemv(
    x: torch.Tensor,  # [..., K], at most MAX_ROWS rows
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,  # [N]
    config: GemvConfig | None = None,  # override of CONFIGS (benchmarks)
    out_dtype: torch.dtype | None = None,  # float32: x.dtype's values, widened (`logits`)
) -> torch.Tensor:
    """The Triton path of `linear`, output in x.dtype (or out_dtype)."""
    return _gemv(x, weight, bias, config, out_dtype, None, None)[0]


def _gemv(x, weight, bias, config, out_dtype, greedy_out, advance) -> tuple[torch.Tensor, bool]:
    """`gemv`; with `greedy_out` ([M] int64) its programs also pick each row's argmax where the
    plan allows (`_greedy_scratch`), and then make `advance` too. -> (output, whether they did)."""
    x2d, weight = _checked(x, weight)
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"gemv writes {x.dtype} or float32, not {out_dtype}")
    out = torch.empty((x2d.shape[0], weight.shape[0]), dtype=out_dtype, device=x.device)
    greedy = None
    if x2d.shape[0] > 0:
        plan = _plan(x2d, weight, config)
        greedy = _greedy_scratch(greedy_out, plan, x.device)
        _launch(x2d, weight, bias, out, plan, greedy=greedy, advance=advance)
    return out.view(*x.shape[:-1], weight.shape[0]), greedy is not None


# The greedy pick across programs (`_greedy_pick`): per device, [MAX_ROWS] int64 best keys (NO_KEY
# between launches) and an int32 arrival count (0 between launches); the last program to arrive
# reads the keys and resets both. NOTE: shared by every call on the device, as `_counters`.
_GREEDY_KEYS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _greedy_scratch(
    greedy_out: torch.Tensor | None, plan: GemvPlan, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(ids out, keys, counter) when the kernel can pick greedily: the dot kernel, no K split
    (each program holds whole rows' values), and scratch that exists outside a graph capture
    (made during one, its fill would only be recorded). Else None: `logits` runs argmax."""
    if greedy_out is None or plan.split_k != 1 or plan.config.kernel != "dot":
        return None
    if greedy_out.dtype != torch.int64 or not greedy_out.is_contiguous():
        return None
    if device not in _GREEDY_KEYS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        keys = torch.full((MAX_ROWS,), NO_KEY.value, dtype=torch.int64, device=device)
        _GREEDY_KEYS[device] = (keys, torch.zeros(1, dtype=torch.int32, device=device))
    return (greedy_out, *_GREEDY_KEYS[device])


# Read registered packed copies (the loader registers QKV's and O's on CUDA). In the graph (H200,
# 2026-12-04, fusion_ab.py packed, fed batch 1): 20b -13 and -8 us a step, 120b -10 and -23, for
# +1.27 GB (20b) / +1.9 GB (120b) of copies. (env: A/B runs)
USE_PACKED = os.environ.get("GOSSAMER_PACKED_GEMV", "1") == "1"


@dataclass(frozen=True)
class PackedWeight:
    tiles: torch.Tensor  # [row blocks, K tiles, block_n, block_k], zero past W's rows and columns
    source: weakref.ref  # the W it copies: another tensor later at the same address is not W


_PACKED: dict[tuple[int, int, int], PackedWeight] = {}  # by W's data pointer and the tile


def pack_tiles(weight: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """W [N, K] -> [cdiv(N, block_n), cdiv(K, block_k), block_n, block_k]: tile (n, t) is rows
    n * block_n.. and columns t * block_k.. of W, zero past its edges."""
    rows, cols = weight.shape
    row_blocks, k_tiles = triton.cdiv(rows, block_n), triton.cdiv(cols, block_k)
    padded = weight.new_zeros(row_blocks * block_n, k_tiles * block_k)
    padded[:rows, :cols] = weight
    return padded.view(row_blocks, block_n, k_tiles, block_k).transpose(1, 2).contiguous()


def register_packed(weight: torch.Tensor, block_n: int, block_k: int) -> None:
    """Keep a tile-packed copy of weight (a parameter that lives as long as the model) for plans
    with this tile to read when USE_PACKED is on. NOTE: a copy, taken now: a weight written in
    place later (the loader packs after loading) must be registered again."""
    tiles = pack_tiles(weight.detach(), block_n, block_k)
    _PACKED[weight.data_ptr(), block_n, block_k] = PackedWeight(tiles, weakref.ref(weight))


def clear_packed() -> None:
    _PACKED.clear()


def _packed_tiles(weight: torch.Tensor, plan: GemvPlan) -> torch.Tensor | None:
    """The registered packed copy of weight that this plan can read, if any."""
    if not USE_PACKED or plan.config.kernel != "dot":
        return None
    packed = _PACKED.get((weight.data_ptr(), plan.config.block_n, plan.config.block_k))
    return packed.tiles if packed is not None and packed.source() is weight else None


def _checked(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as [M, K] rows and weight, both with a unit stride along K; raises on shapes not served."""
    in_features = x.shape[-1]
    x2d = x.reshape(-1, in_features)
    if x2d.shape[0] > MAX_ROWS:
        raise ValueError(f"gemv serves at most {MAX_ROWS} rows, got {x2d.shape[0]}")
    if weight.shape[1] != in_features:
        raise ValueError(f"x has {in_features} features but weight is {tuple(weight.shape)}")
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    return x2d, weight


def _plan(x2d: torch.Tensor, weight: torch.Tensor, config: GemvConfig | None) -> GemvPlan:
    num_sms = _num_sms(x2d.device)
    return plan_gemv(x2d.shape[0], weight.shape[0], x2d.shape[1], num_sms, config)


def _launch(
    x,
    weight,
    bias,
    out,
    plan: GemvPlan,
    greedy=None,
    advance: DecodeAdvance | None = None,
) -> None:
    config, (num_tokens, in_features), out_features = plan.config, x.shape, weight.shape[0]
    split = _split_mode(plan, x.device)
    partial = out  # unused without a split
    if split != NO_SPLIT:
        partial_shape = (plan.split_k, num_tokens, out_features)  # float32 partial sums
        partial = torch.empty(partial_shape, dtype=torch.float32, device=x.device)
    counters = _counters(x.device) if split == SPLIT_LAST else out
    has_bias = bias is not None
    bias_arg = bias if has_bias else weight
    packed = _packed_tiles(weight, plan)
    w_arg = weight if packed is None else packed
    args = (x, w_arg, bias_arg, out, partial, counters, num_tokens, out_features, in_features,
            x.stride(0), weight.stride(0), out.stride(0), plan.k_per_split)  # fmt: skip
    round_out = out.dtype != x.dtype  # `logits`: float32 values of x's dtype
    constants = dict(
        ROUND_OUT=round_out,
        HAS_BIAS=has_bias,
        SPLIT=split,
        NUM_SPLITS=plan.split_k,
        EVEN_K=in_features % config.block_k == 0,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        **pdl.launch_options(x.device),
    )
    grid = (plan.row_blocks, plan.split_k)
    if config.kernel == "fma":
        _gemv_fma_kernel[grid](*args, VEC=16 // x.element_size(), **constants)
    else:
        ieee = x.dtype == torch.float32
        greedy_args = {}
        if greedy is not None:
            greedy_args = dict(zip(("greedy_ptr", "keys_ptr", "arrivals_ptr"), greedy, strict=True))
            greedy_args["GREEDY"] = True
            if advance is not None:
                greedy_args.update(_advance_args(advance))
        _gemv_dot_kernel[grid](*args, IEEE_FP32=ieee, BLOCK_M=plan.block_m,
                               num_stages=config.num_stages, PREFETCH=config.prefetch,
                               EARLY=config.early, PACKED=packed is not None,
                               **greedy_args, **constants)  # fmt: skip
    if split == SPLIT_REDUCE:
        block = 256
        _reduce_splits_kernel[(num_tokens, triton.cdiv(out_features, block))](
            partial, bias_arg, out, num_tokens, out_features, out.stride(0), HAS_BIAS=has_bias,
            NUM_SPLITS=plan.split_k, BLOCK=block, num_warps=4, X_TY=_TL_DTYPES[x.dtype],
            ROUND_OUT=round_out, **pdl.launch_options(x.device),
        )  # fmt: skip


def _advance_args(advance: DecodeAdvance) -> dict:
    """The dot kernel's ADVANCE arguments (`_advance_inputs`)."""
    tables, slots = advance.block_tables, advance.slot_mapping
    return dict(adv_positions_ptr=advance.positions, adv_seq_lens_ptr=advance.seq_lens,
                adv_slots_ptr=slots, adv_slot_stride=slots.stride(0), adv_tables_ptr=tables,
                adv_group_stride=tables.stride(0), adv_seq_stride=tables.stride(1),
                adv_column_stride=tables.stride(2), adv_table_columns=tables.shape[2],
                adv_block_size=advance.block_size, ADVANCE_GROUPS=tables.shape[0])  # fmt: skip


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _split_mode(plan: GemvPlan, device: torch.device) -> int:
    if plan.split_k == 1:
        return NO_SPLIT
    if plan.config.fixup == "reduce" or plan.row_blocks > COUNTER_SLOTS:
        return SPLIT_REDUCE
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing and device not in _COUNTERS:
        return SPLIT_REDUCE  # zeroing the counters now would only be recorded, not done
    return SPLIT_LAST


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """[COUNTER_SLOTS] int32 arrival counts per row block, zero between launches: the last program
    of a row block resets its slot. NOTE: shared by every call on the device, so two split launches
    must not run at once on different streams."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


@functools.lru_cache(maxsize=8)
def _num_sms_cached(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a small number still exercises the split-K path
    return _num_sms_cached(
        device.index if device.index is not None else torch.cuda.current_device()
    )


# ------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------


@triton.jit
def _gemv_dot_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N]
    out_ptr,  # [M, N]
    partial_ptr,  # [NUM_SPLITS, M, N] float32 (SPLIT)
    counter_ptr,  # [COUNTER_SLOTS] int32 (SPLIT_LAST)
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_out,
    k_per_split,  # a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,  # NO_SPLIT, SPLIT_REDUCE or SPLIT_LAST
    NUM_SPLITS: tl.constexpr,  # grid axis 1
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no column masks
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,  # W tiles sent to L2 before the PDL wait
    EARLY: tl.constexpr = False,  # the first W tile loaded into registers before the PDL wait
    PACKED: tl.constexpr = False,  # w_ptr is pack_tiles(W, BLOCK_N, BLOCK_K): tiles are runs
    ROUND_OUT: tl.constexpr = False,  # a float32 out_ptr gets values rounded to x's dtype first
    greedy_ptr=None,  # [M] int64: each row's argmax (GREEDY)
    keys_ptr=None,  # [MAX_ROWS] int64 scratch (GREEDY; `_greedy_scratch`)
    arrivals_ptr=None,  # [1] int32 scratch (GREEDY)
    GREEDY: tl.constexpr = False,  # pick each row's argmax across programs (SPLIT == 0 only)
    adv_positions_ptr=None,  # (ADVANCE_GROUPS > 0) ops.base.DecodeAdvance's tensors, M rows
    adv_seq_lens_ptr=None,
    adv_slots_ptr=None,
    adv_slot_stride=0,
    adv_tables_ptr=None,
    adv_group_stride=0,  # the block tables' strides
    adv_seq_stride=0,
    adv_column_stride=0,
    adv_table_columns=0,
    adv_block_size=1,
    ADVANCE_GROUPS: tl.constexpr = 0,  # with GREEDY: the program that writes the picks advances
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row_ids = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    token_ids = tl.arange(0, BLOCK_M)
    # NOTE: clamped indices keep the loads of ragged edges in bounds without masks; the final store
    # drops the duplicated rows and tokens.
    rows = tl.minimum(row_ids, N - 1).to(tl.int64)
    tokens = tl.minimum(token_ids, M - 1)
    k_begin = pid_k * k_per_split
    k_len = tl.minimum(K - k_begin, k_per_split)
    cols = tl.arange(0, BLOCK_K)
    if PACKED:  # tile (pid_n, k_begin / BLOCK_K) and the next ones: one run; no masks (zeros)
        tile_rows = tl.arange(0, BLOCK_N)
        first_tile = pid_n.to(tl.int64) * tl.cdiv(K, BLOCK_K) + k_begin // BLOCK_K
        w_rows = w_ptr + first_tile * (BLOCK_N * BLOCK_K) + tile_rows * BLOCK_K  # [BLOCK_N]
        W_STEP: tl.constexpr = BLOCK_N  # W elements per column of the split
    else:
        w_rows = w_ptr + rows * stride_w + k_begin
        W_STEP: tl.constexpr = 1
    w_ptrs = w_rows[:, None] + cols[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + tokens[None, :] * stride_x + k_begin + cols[:, None]  # x^T [BLOCK_K, BLOCK_M]
    if PDL:
        # the weights no kernel writes: start their trip from HBM while the previous kernel runs
        for tile in tl.static_range(PREFETCH):
            _prefetch_l2(w_rows, tile * BLOCK_K * W_STEP, k_len * W_STEP, BLOCK_K)
    if EARLY:  # weights: no kernel writes them
        w_first = _masked_load(w_ptrs, (cols < k_len)[None, :], EVEN_K or PACKED)
    pdl.wait(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    start = 0
    if EARLY:  # the first tile peeled off the loop
        x = _masked_load(x_ptrs, (cols < k_len)[:, None], EVEN_K)
        acc = _dot_acc(w_first, x, acc, IEEE_FP32)
        start = BLOCK_K
    for offset in range(start, k_len, BLOCK_K):
        w = _masked_load(w_ptrs + offset * W_STEP, (offset + cols < k_len)[None, :],
                         EVEN_K or PACKED)  # fmt: skip
        x = _masked_load(x_ptrs + offset, (offset + cols < k_len)[:, None], EVEN_K)
        acc = _dot_acc(w, x, acc, IEEE_FP32)
    _finish(acc, row_ids, token_ids, M, N, bias_ptr, out_ptr, stride_out, partial_ptr, counter_ptr,
            pid_n, pid_k, HAS_BIAS, SPLIT, NUM_SPLITS, x_ptr.dtype.element_ty, ROUND_OUT,
            greedy_ptr, keys_ptr, arrivals_ptr, GREEDY,
            (adv_positions_ptr, adv_seq_lens_ptr, adv_slots_ptr, adv_slot_stride, adv_tables_ptr,
             adv_group_stride, adv_seq_stride, adv_column_stride, adv_table_columns,
             adv_block_size), ADVANCE_GROUPS)  # fmt: skip


@triton.jit
def _dot_acc(w, x, acc, IEEE_FP32: tl.constexpr):
    if IEEE_FP32:
        return tl.dot(w, x, acc, input_precision="ieee")
    return tl.dot(w, x, acc)


@triton.jit
def _gemv_fma_kernel(
    x_ptr,  # [1, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N]
    out_ptr,  # [1, N]
    partial_ptr,  # [NUM_SPLITS, 1, N] float32 (SPLIT)
    counter_ptr,  # [COUNTER_SLOTS] int32 (SPLIT_LAST)
    M,  # 1
    N,
    K,
    stride_x,
    stride_w,
    stride_out,
    k_per_split,  # a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    VEC: tl.constexpr,  # elements per 16-byte load
    PDL: tl.constexpr,
    ROUND_OUT: tl.constexpr = False,  # as in _gemv_dot_kernel
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row_ids = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(row_ids, N - 1)  # clamped: see _gemv_dot_kernel
    k_begin = pid_k * k_per_split
    k_len = tl.minimum(K - k_begin, k_per_split)
    # [chunks, rows, VEC]: rows vary slowest across threads, so a warp's 16-byte loads cover a
    # contiguous run of one row and each thread holds several rows at the same columns.
    cols = tl.arange(0, BLOCK_K // VEC)[:, None, None] * VEC + tl.arange(0, VEC)[None, None, :]
    w_ptrs = w_ptr + rows.to(tl.int64)[None, :, None] * stride_w + k_begin + cols
    # NOTE: x through the same pointer shape with a zero row stride gets W's register layout, and a
    # thread's loads of one x chunk for its several rows are merged into one (no shared memory).
    x_ptrs = x_ptr + (rows * 0)[None, :, None] + k_begin + cols
    acc = tl.zeros([BLOCK_K // VEC, BLOCK_N, VEC], tl.float32)
    w_next = _load_columns(w_ptrs, cols, 0, k_len, EVEN_K, BLOCK_K)  # weights: before the wait
    pdl.wait(PDL)
    x_next = _load_columns(x_ptrs, cols, 0, k_len, EVEN_K, BLOCK_K).to(tl.float32)
    for offset in range(0, k_len, BLOCK_K):
        w, x = w_next, x_next
        # double buffering: the next tile's loads are issued before this tile's multiply-adds
        w_next = _load_columns(w_ptrs, cols, offset + BLOCK_K, k_len, EVEN_K, BLOCK_K)
        x_next = _load_columns(x_ptrs, cols, offset + BLOCK_K, k_len, EVEN_K, BLOCK_K)
        x_next = x_next.to(tl.float32)
        acc += w.to(tl.float32) * x
    y = tl.sum(tl.sum(acc, axis=2), axis=0)  # [BLOCK_N]
    _finish(y[:, None], row_ids, tl.arange(0, 1), 1, N, bias_ptr, out_ptr, stride_out, partial_ptr,
            counter_ptr, pid_n, pid_k, HAS_BIAS, SPLIT, NUM_SPLITS, x_ptr.dtype.element_ty,
            ROUND_OUT)  # fmt: skip


@triton.jit
def _masked_load(ptrs, mask, EVEN_K: tl.constexpr):
    """A tile whose columns are all in range (EVEN_K), else zero where not mask."""
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _prefetch_l2(row_ptrs, offset, k_len, BLOCK_K: tl.constexpr):
    """Ask for columns [offset, offset + BLOCK_K) of the rows at row_ptrs ([BLOCK_N] pointers) to
    be brought into L2, if inside k_len: one request per 128-byte line; nothing waits for it."""
    LINE: tl.constexpr = 1024 // row_ptrs.dtype.element_ty.primitive_bitwidth  # elements per line
    LINES: tl.constexpr = BLOCK_K // LINE if BLOCK_K >= LINE else 1
    if offset < k_len:
        pdl.prefetch_l2(row_ptrs[:, None] + offset + tl.arange(0, LINES)[None, :] * LINE)


@triton.jit
def _load_columns(ptrs, cols, offset, k_len, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tile at ptrs + offset, zero at columns >= k_len."""
    at = _column_offset(offset, k_len, EVEN_K, BLOCK_K)
    return _masked_load(ptrs + at, offset + cols < k_len, EVEN_K)


@triton.jit
def _column_offset(offset, k_len, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Where the tile of columns [offset, offset + BLOCK_K) is read from."""
    if EVEN_K:
        # k_len is a multiple of BLOCK_K, so only the final prefetch falls outside: it reads the
        # last tile again (an L1 hit, never used) and no load needs a mask
        return tl.minimum(offset, k_len - BLOCK_K)
    return offset


@triton.jit
def _finish(
    acc,  # [BLOCK_N, BLOCK_M] float32
    row_ids,  # [BLOCK_N] (unclamped)
    token_ids,  # [BLOCK_M] (unclamped)
    M,
    N,
    bias_ptr,
    out_ptr,
    stride_out,
    partial_ptr,
    counter_ptr,
    pid_n,
    pid_k,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    X_TY: tl.constexpr,  # x's element type (ROUND_OUT)
    ROUND_OUT: tl.constexpr,
    greedy_ptr=None,
    keys_ptr=None,
    arrivals_ptr=None,
    GREEDY: tl.constexpr = False,  # (SPLIT == 0 only)
    advance_args=None,  # (ADVANCE_GROUPS > 0) `_advance_inputs`'s arguments
    ADVANCE_GROUPS: tl.constexpr = 0,
):
    mask = (row_ids[:, None] < N) & (token_ids[None, :] < M)
    if SPLIT == 0:
        out = _store_output(acc, row_ids, token_ids, N, mask, bias_ptr, out_ptr, stride_out,
                            HAS_BIAS, X_TY, ROUND_OUT)  # fmt: skip
        if GREEDY:
            _greedy_pick(out, row_ids, token_ids, M, mask, greedy_ptr, keys_ptr, arrivals_ptr,
                         advance_args, ADVANCE_GROUPS)  # fmt: skip
    else:
        partials = partial_ptr + token_ids[None, :] * N + row_ids[:, None]  # split 0's [N, M] view
        tl.store(partials + pid_k * M * N, acc, mask=mask)
        if SPLIT == 2:
            # NOTE: the barrier orders every thread's partial store before the (release) arrival;
            # the program that sees all others arrived (acquire) sums the splits in order 0, 1, ...
            # so the result does not depend on which one came last.
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                total = tl.zeros(acc.shape, tl.float32)
                for split in tl.static_range(NUM_SPLITS):  # unrolled: all loads in flight at once
                    total += tl.load(partials + split * M * N, mask=mask, other=0.0,
                                     cache_modifier=".cg")  # fmt: skip
                tl.store(counter_ptr + pid_n, 0)  # ready for the next launch
                _store_output(total, row_ids, token_ids, N, mask, bias_ptr, out_ptr, stride_out,
                              HAS_BIAS, X_TY, ROUND_OUT)  # fmt: skip


@triton.jit
def _store_output(acc, row_ids, token_ids, N, mask, bias_ptr, out_ptr, stride_out,
                  HAS_BIAS: tl.constexpr, X_TY: tl.constexpr, ROUND_OUT: tl.constexpr):  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(bias_ptr + row_ids, mask=row_ids < N, other=0.0).to(tl.float32)[:, None]
    if ROUND_OUT:  # the values an x-dtype output would hold, widened (`logits`)
        acc = acc.to(X_TY).to(tl.float32)
    out = out_ptr + token_ids[None, :] * stride_out + row_ids[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    return acc


@triton.jit
def _greedy_pick(values, row_ids, token_ids, M, mask, greedy_ptr, keys_ptr, arrivals_ptr,
                 advance_args, ADVANCE_GROUPS: tl.constexpr):  # fmt: skip
    """Each token's argmax over all programs' rows (values [BLOCK_N, BLOCK_M] as stored): this
    program's best (value, row) as one key (keys.value_key: larger value, then lower row), one
    atomic max per token into keys_ptr, then an arrival count; the last program to arrive reads
    the winners, writes their rows to greedy_ptr and resets the scratch for the next launch (and
    with ADVANCE_GROUPS moves the step's inputs on: `_advance_inputs`)."""
    keys = tl.where(mask, value_key(values, row_ids[:, None], 2**32), NO_KEY)
    live = token_ids < M
    # relaxed: the arrival's release orders it (no fence of its own in every program's tail)
    tl.atomic_max(keys_ptr + token_ids, tl.max(keys, axis=0), mask=live, sem="relaxed")
    # NOTE: as in the split fix-up: the barrier orders every thread's atomic before the release
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        best = tl.atomic_xchg(keys_ptr + token_ids, NO_KEY, mask=live, sem="relaxed")
        tl.store(greedy_ptr + token_ids, key_index(best, 2**32), mask=live)
        tl.store(arrivals_ptr, 0)
        if ADVANCE_GROUPS > 0:
            _advance_inputs(token_ids, live, advance_args, ADVANCE_GROUPS)


@triton.jit
def _advance_inputs(rows, live, advance_args, GROUPS: tl.constexpr):
    """ops.base.DecodeAdvance.apply for rows [BLOCK_M] (one token a sequence; `live` < M): rows
    whose group-0 slot is not negative go to the next position, its slot in every group's table
    (-1 past the table's columns) and one more key. Nothing else in the step reads them by now."""
    positions_ptr, seq_lens_ptr, slots_ptr, slot_stride, tables_ptr, group_stride, seq_stride, \
        column_stride, table_columns, block_size = advance_args  # fmt: skip
    real = live & (tl.load(slots_ptr + rows, mask=live, other=-1) >= 0)
    positions = tl.load(positions_ptr + rows, mask=real, other=0) + 1
    tl.store(positions_ptr + rows, positions, mask=real)
    tl.store(seq_lens_ptr + rows, tl.load(seq_lens_ptr + rows, mask=real, other=0) + 1, mask=real)
    columns = positions // block_size
    inside = columns < table_columns
    for group in tl.static_range(GROUPS):
        entries = tables_ptr + group * group_stride + rows * seq_stride + columns * column_stride
        blocks = tl.load(entries, mask=real & inside, other=0).to(tl.int64)
        slots = tl.where(inside, blocks * block_size + positions % block_size, -1)
        tl.store(slots_ptr + group * slot_stride + rows, slots, mask=real)


@triton.jit
def _reduce_splits_kernel(
    partial_ptr,  # [NUM_SPLITS, M, N] float32
    bias_ptr,  # [N]
    out_ptr,  # [M, N]
    M,
    N,
    stride_out,
    HAS_BIAS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    X_TY: tl.constexpr = tl.float32,  # as in _finish
    ROUND_OUT: tl.constexpr = False,
):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    pdl.wait(PDL)
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for split in tl.static_range(NUM_SPLITS):  # unrolled: all loads in flight at once
        acc += tl.load(partial_ptr + (split * M + token) * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ROUND_OUT:
        acc = acc.to(X_TY).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)
