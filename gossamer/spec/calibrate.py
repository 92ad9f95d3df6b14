"""Step costs timed on the engine's own runner at start-up: the table the cost-aware k decides
with (gossamer/spec/cost.py), for the model and GPU at hand rather than gpt-oss-120b's.

A point of the table is a verification step of `batch` stand-in sequences that each feed 1 + k
tokens after CALIBRATION_CONTEXT cached ones (KV blocks of the still empty pool), replayed from
the CUDA graph the engine captured for that uniform shape. It covers the k the graphs exist for
(0 and the draft-length ladder: what padded steps verify) at batch sizes 1, 4, 16 and the
largest batch multi-token graphs exist for (at most max_num_seqs). Each point is the median of a
few steps after a warm-up one; a step includes what the engine pays around a replay (filling the
inputs, the host reading the sampled tokens back), in milliseconds. gpt-oss-120b: 4 batches x 4
k x 6 steps of 3 to 10 ms, about half a second.

`benchmarks/spec_decode.py verify-cost` times the same steps (eagerly too) with these functions.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from gossamer.runner.model_runner import SeqInput
from gossamer.spec.config import CostTable, SpecConfig

if TYPE_CHECKING:
    from gossamer.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)

CALIBRATION_BATCHES = (1, 4, 16)  # and the largest batch with multi-token graphs
CALIBRATION_CONTEXT = 1024  # tokens each stand-in sequence has in the KV cache
CALIBRATION_STEPS = 5  # timed steps per point (after one warm-up step)
FIRST_BLOCK = 1  # block 0 is the null block (gossamer/cache/block_pool.py)

Timer = Callable[[], float]


def verify_seqs(
    batch: int,
    k: int,
    context: int,
    blocks_per_seq: int,
    num_groups: int,
    num_blocks: int | None = None,
) -> list[SeqInput]:
    """A uniform verification step: `batch` sequences that each feed 1 + k tokens at position
    `context` and want every logit. Each sequence and cache group reads blocks of its own from
    block 1 on; in a pool of `num_blocks` too small for that they wrap around (shared blocks)."""
    usable = None if num_blocks is None else num_blocks - FIRST_BLOCK
    seqs = []
    for index in range(batch):
        tables = []
        for group in range(num_groups):
            first = (index * num_groups + group) * blocks_per_seq
            ids = range(first, first + blocks_per_seq)
            tables.append([FIRST_BLOCK + (i if usable is None else i % usable) for i in ids])
        seqs.append(SeqInput([1] * (k + 1), context, tuple(tables), num_logits=k + 1))
    return seqs


def time_step(
    runner: ModelRunner,
    seqs: list[SeqInput],
    steps: int,
    warmups: int = 1,
    timer: Timer = time.perf_counter,
) -> float:
    """Median seconds of `steps` runs of `seqs`, after `warmups` untimed ones. Each run ends with
    the host reading the greedy tokens, as the engine does: it waits for the GPU."""
    for _ in range(warmups):
        runner.run(seqs).argmax(-1).tolist()
    seconds = []
    for _ in range(steps):
        start = timer()
        runner.run(seqs).argmax(-1).tolist()
        seconds.append(timer() - start)
    return statistics.median(seconds)


def calibration_batches(graph_keys: Collection[tuple[int, int]], ks: Sequence[int]) -> list[int]:
    """The batch sizes of CALIBRATION_BATCHES, and the largest, that have a graph of every
    (batch, 1 + k): a measured row holds replays only."""
    sizes = sorted({size for size, _ in graph_keys if all((size, 1 + k) in graph_keys for k in ks)})
    if not sizes:
        return []
    return sorted({size for size in sizes if size in CALIBRATION_BATCHES} | {sizes[-1]})


def measure_cost_table(
    runner: ModelRunner,
    ks: Sequence[int],
    num_blocks: int,
    steps: int = CALIBRATION_STEPS,
    timer: Timer = time.perf_counter,
) -> CostTable:
    """((batch, ((k, ms per step), ...)), ...) from graph replays of the runner; empty when it
    captured no graphs of every k. The runner's step counts (EngineStats.runner_steps) are left
    as they were."""
    batches = calibration_batches(runner.graphs, ks)
    if not batches:
        return ()
    block_size = runner.block_size
    room = runner.max_blocks_per_seq * block_size - max(ks) - 1  # the model's context limit
    context = max(min(CALIBRATION_CONTEXT, room), 1)
    blocks_per_seq = -(-(context + max(ks) + 1) // block_size)
    step_modes = Counter(runner.step_modes)
    rows = []
    try:
        for batch in batches:
            points, slowest = [], 0.0
            for k in sorted(ks):
                seqs = verify_seqs(batch, k, context, blocks_per_seq, runner.num_groups, num_blocks)
                # NOTE: feeding more tokens never costs less; a faster reading is noise
                slowest = max(slowest, 1e3 * time_step(runner, seqs, steps, timer=timer))
                points.append((k, slowest))
            rows.append((batch, tuple(points)))
    finally:
        runner.step_modes = step_modes  # the calibration's steps are no engine steps
    return tuple(rows)


def calibrated_cost_table(
    config: SpecConfig,
    runner: ModelRunner,
    num_blocks: int,
    timer: Timer = time.perf_counter,
) -> CostTable | None:
    """The measured step-cost table the cost-aware k should use, or None to keep the configured
    one: no cost model, an explicit `cost_table` (it wins), or no CUDA graphs (CPU, eager or
    `cuda_graphs` off: the built-in table stays)."""
    if not config.chooses_k or config.cost_table is not None or not getattr(runner, "graphs", None):
        return None
    start = time.perf_counter()
    table = measure_cost_table(runner, (0, *config.draft_len_ladder), num_blocks, timer=timer)
    if not table:
        return None
    logger.info(
        "speculative decoding: step costs measured in %.2f s, ms per verification step "
        "{batch: {k: ms}}: %s",
        time.perf_counter() - start,
        format_cost_table(table),
    )
    return table


def format_cost_table(table: CostTable) -> str:
    rows = (
        f"{batch}: {{{', '.join(f'{k}: {cost:.3f}' for k, cost in points)}}}"
        for batch, points in table
    )
    return "{" + ", ".join(rows) + "}"
