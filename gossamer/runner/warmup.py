"""Start-up kernel warm-up: one eager dummy step per launch shape that selects its own Triton
specialization, so that no request pays a JIT compile (about a second) in the serving path.

Triton compiles one binary per kernel and specialization key: the constexpr arguments, plus for each
integer argument whether it is 1 or a multiple of 16, and for each pointer whether it is 16-byte
aligned. Strides, head counts and buffer addresses are fixed by the model and the runner's
persistent buffers; what changes from step to step is:

* attention (kernels/attention.py). The decode launch (max_query_len <= DECODE_MAX_QUERY_LEN: decode,
  verification, short prefill tails after a prefix hit) has BLOCK_Q = next_power_of_2(max_query_len)
  (1, 2, 4, 8) and SPLIT = num_splits > 1. num_splits is a power of two up to MAX_SPLITS, set by the
  visible keys (cdiv(keys, DECODE_BLOCK_N) at most) and the batch; it is also an integer argument
  (1, a multiple of 16, or neither) and the in-kernel merge's SPLITS_P2 (or the merge kernel's,
  when that runs). The prefill launch has one key. SLIDING is per layer (every forward runs both
  kinds); TREE only in tree speculation (below).
* MoE (kernels/moe_mxfp4.py): the GEMV path up to a pair limit, then the expert-grouped GEMV
  (kernels/moe_grouped_gemv.py, up to a second limit) with its M-tile size, then the grouped
  path, whose BLOCK_M grows with the mean pairs per expert. Both grouped MXFP4 paths sort their
  pairs by expert with a binary per power of two of pairs (moe_grouped_gemv.schedule_sort_size).
* linear (kernels/gemv.py): Triton up to GEMV_MAX_M rows with BLOCK_M = next_power_of_2(rows), its
  own config at M == 1 and from WIDE_FROM rows, and M specialized (1, a multiple of 16, neither):
  gemv.launch_key; cuBLAS above (nothing to compile). rms_norm and rope: one key each.

The plan: decode launches of 1, 2, 4 and 8 tokens (each BLOCK_Q), each at a short context (one
split) and at the shortest context of each split count 2..MAX_SPLITS (every num_splits a batch of
one can get; larger batches get fewer splits, never a new count), and prefill steps at the first
token count of each MoE and linear launch shape the decode steps missed, above
DECODE_MAX_QUERY_LEN (the prefill attention) and at the full token budget (the largest
activations, so the allocator holds them). For gpt-oss-120b with the default 8192-token budget:
4 x 7 decode steps + 11 prefill steps (9, 16, 17, 32, 33, 48, 65, 129, 257, 2017 and 8192 tokens).

Tree speculation (a runner with `tree_query_len`): its tree graphs compile their launches when they
are captured, but tree steps no graph holds (larger batches, a tree beside a prompt chunk) run
eagerly with TREE on. So the plan adds tree steps: the decode launch at each BLOCK_Q a tree step
can take (2, 4, 8, up to the tree's tokens) and each split count, and one prefill launch.

Nothing touches real cache contents: every block table entry is the null block (block 0, never
handed to a request) and every KV slot is -1, so the steps only read zeros and write no KV.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from gossamer.cache.block_pool import NULL_BLOCK_ID
from gossamer.runner.model_runner import ModelRunner, SeqInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupStep:
    """One dummy step: sequences that start at `start` cached tokens and feed `query_lens`."""

    query_lens: tuple[int, ...]  # tokens each sequence feeds
    start: int = 0  # tokens each sequence has in the cache before the step
    all_logits: bool = False  # logits of every fed token (as a verification step), else the last
    tree: bool = False  # the sequences carry tree masks (a chain's): TREE attention launches

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass(frozen=True)
class MoEShape:
    """What the MoE launch choice depends on besides the token count."""

    num_experts: int
    top_k: int
    mxfp4: bool


def warm_up(runner: ModelRunner, progress: bool = True) -> list[WarmupStep]:
    """Run the warm-up plan of `runner` eagerly; returns the steps run. Logs the time taken."""
    model = runner.model
    config = model.config
    moe = MoEShape(config.num_local_experts, config.num_experts_per_tok, model.mxfp4)
    steps = warmup_plan(model.max_model_len, runner.max_tokens, runner.max_num_seqs, moe)
    if runner.tree_query_len is not None:
        steps += tree_warmup_plan(model.max_model_len, runner.max_tokens, runner.tree_query_len)
    began = time.perf_counter()
    for step in tqdm(steps, desc="warming up kernels", disable=not progress):
        runner.dry_run(step_inputs(step, runner.block_size, runner.num_groups))
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    elapsed = time.perf_counter() - began
    logger.info("kernel warm-up: %d eager forward passes in %.1f s", len(steps), elapsed)
    return steps


def warmup_plan(
    max_model_len: int, max_tokens: int, max_num_seqs: int, moe: MoEShape
) -> list[WarmupStep]:
    """The steps that reach every launch shape a runner with these limits can take (module doc)."""
    # NOTE: imported here so that the runner (and the CPU-only paths) do not need Triton.
    from gossamer.kernels.attention import DECODE_MAX_QUERY_LEN

    decode_lens = [1 << i for i in range(DECODE_MAX_QUERY_LEN.bit_length())]
    decode_lens = [q for q in decode_lens if q <= min(DECODE_MAX_QUERY_LEN, max_tokens)]
    contexts = split_contexts(max_model_len)
    steps = [
        WarmupStep((q,), start=context - q, all_logits=True)
        for q in decode_lens
        for context in (q, *contexts)
        if q <= context <= max_model_len
    ]
    for num_tokens in prefill_token_counts(max_tokens, decode_lens, moe):
        query_lens = _chunks(num_tokens, max_model_len)
        if len(query_lens) <= max_num_seqs:  # else no step of the scheduler has that many tokens
            steps.append(WarmupStep(query_lens))
    return steps


def tree_warmup_plan(max_model_len: int, max_tokens: int, tree_query_len: int) -> list[WarmupStep]:
    """Tree steps (module doc): decode launches of BLOCK_Q 2, 4, 8 (a sequence of min(BLOCK_Q,
    tree_query_len) tokens) at every split count, and a prefill launch."""
    from gossamer.kernels.attention import DECODE_MAX_QUERY_LEN

    block_qs = [1 << i for i in range(1, DECODE_MAX_QUERY_LEN.bit_length())]
    lens = sorted(
        {min(block_q, tree_query_len) for block_q in block_qs if block_q // 2 < tree_query_len}
    )
    steps = [
        WarmupStep((q,), start=context - q, all_logits=True, tree=True)
        for q in lens
        if q >= 2 and q <= max_tokens
        for context in (q, *split_contexts(max_model_len))
        if q <= context <= max_model_len
    ]
    prefill = DECODE_MAX_QUERY_LEN + 1  # a tree beside a prompt chunk: the prefill launch
    if prefill <= min(max_tokens, max_model_len):
        steps.append(WarmupStep((prefill,), all_logits=True, tree=True))
    return steps


def split_contexts(max_model_len: int) -> list[int]:
    """The shortest context of each split count 2, 4, .. MAX_SPLITS of the decode attention
    (cdiv(keys, DECODE_BLOCK_N) = the count) that fits max_model_len."""
    from gossamer.kernels.attention import DECODE_BLOCK_N, MAX_SPLITS

    counts = [1 << i for i in range(1, MAX_SPLITS.bit_length())]
    contexts = [DECODE_BLOCK_N * (count - 1) + 1 for count in counts]
    return [context for context in contexts if context <= max_model_len]


def prefill_token_counts(max_tokens: int, decode_lens: list[int], moe: MoEShape) -> list[int]:
    """Token counts of the steps after the decode ones: the first count of each (MoE, linear)
    launch shape that no decode step reaches, one above DECODE_MAX_QUERY_LEN (the prefill
    attention launch) and the full budget."""
    from gossamer.kernels import gemv
    from gossamer.kernels.attention import DECODE_MAX_QUERY_LEN

    moe_shape = moe_launch_shape(moe)

    def launch(count: int) -> tuple:
        return moe_shape(count), gemv.launch_key(count)

    covered = {launch(count) for count in decode_lens}
    first: dict[tuple, int] = {}
    for count in range(1, max_tokens + 1):
        first.setdefault(launch(count), count)
    counts = {count for shape, count in first.items() if shape not in covered}
    counts |= {DECODE_MAX_QUERY_LEN + 1, max_tokens}
    return sorted(count for count in counts if count <= max_tokens)


def moe_launch_shape(moe: MoEShape) -> Callable[[int], tuple]:
    """token count -> the MoE kernels' launch shape, as `moe_mxfp4.moe_mxfp4` picks it: the GEMV
    path, the expert-grouped GEMV with its M-tile size, or the grouped path (v2 for MXFP4 experts)
    with its BLOCK_M."""
    from gossamer.kernels import moe_grouped_gemv, moe_mxfp4

    limit = min(moe_mxfp4.DECODE_MAX_PAIRS, moe_mxfp4.DECODE_PAIRS_PER_EXPERT * moe.num_experts)

    def shape(num_tokens: int) -> tuple:
        pairs = num_tokens * moe.top_k
        if moe.mxfp4 and pairs <= limit:
            return ("gemv",)
        # both grouped MXFP4 paths sort their pairs with a binary per schedule_sort_size
        sort = moe_grouped_gemv.schedule_sort_size(pairs)
        if moe.mxfp4 and pairs <= moe_mxfp4.GROUPED_GEMV_MAX_PAIRS:
            block_m = moe_grouped_gemv.default_block_m(pairs, moe.num_experts)
            return ("grouped_gemv", block_m, sort)
        if moe.mxfp4 and moe_mxfp4.GROUPED_V2:  # its tile follows the M-tile (V2_TILE_CHANGES)
            return ("grouped_v2", moe_mxfp4._v2_block_m(pairs, moe.num_experts), sort)
        return ("grouped", moe_mxfp4._block_m(pairs, moe.num_experts))

    return shape


def step_inputs(step: WarmupStep, block_size: int, num_groups: int) -> list[SeqInput]:
    """The step's sequences, every block table entry the null block (`dry_run` writes no KV)."""
    seqs = []
    for query_len in step.query_lens:
        context = step.start + query_len
        table = np.full(-(-context // block_size), NULL_BLOCK_ID, dtype=np.int32)
        tables = tuple(table for _ in range(num_groups))
        logits = query_len if step.all_logits else 1
        # a chain as tree masks: token j sees tokens 0..j of the step
        masks = tuple((1 << (j + 1)) - 1 for j in range(query_len)) if step.tree else None
        seqs.append(SeqInput([0] * query_len, step.start, tables, logits, masks))
    return seqs


def _chunks(num_tokens: int, limit: int) -> tuple[int, ...]:
    """num_tokens cut into sequences of at most `limit` tokens."""
    full, rest = divmod(num_tokens, limit)
    return (limit,) * full + ((rest,) if rest else ())
