"""Model runner: turns one step's scheduled sequences into flat model inputs, runs the model
(CUDA-graph replay for pure decode batches on the GPU, eager otherwise) and returns the logits of the
positions that need them.

Inputs live in persistent buffers sized once at start-up, so a step is: fill host arrays, one copy to
the device, run. The same buffers back the captured graphs. On the GPU the host arrays are pinned
and copied without blocking, so filling and launching a step never waits for the one before it
(engine/overlap.py); `UploadFence` keeps the next fill from rewriting them too early.

Greedy picks in the graph (GREEDY_IN_GRAPH, on): plain-decode graphs also write each
token's argmax into `greedy_ids` (`last_greedy` after a replay). Fed back as the next step's
`device_input_ids`, they are not copied: the upload writes -1 for those tokens and the embedding
reads the pick from `greedy_ids` (Ops.embed).

Inputs advanced in the graph (ADVANCE_IN_GRAPH, with GREEDY_IN_GRAPH; on): the
batch-1 decode graphs' unembedding, which writes the pick, also moves the step's positions,
sequence length and slots on by a token (ops.base.DecodeAdvance). StepBuffers knows what the
device then holds, so the next step, fed its pick in place, uploads nothing (`_upload`).

Context buckets (CONTEXT_GRAPHS, on): graphs of a few tokens (small decode and
verification batches) also get copies captured for shorter contexts than max_model_len
(`ops.decode_context_bounds`), and a step replays the first whose bound holds its longest sequence,
so that attention launches the key splits an uncaptured step of that context would.

Tree graphs (`tree_query_len`, tree speculation): graphs of `tree_query_len` tokens per sequence
whose attention reads the tree mask from a device buffer. They replay any step whose sequences feed
at most that many tokens each (tree verification, a truncated tree, a plain decode beside them, the
draft model's tree growth): each sequence is padded at its end to the full length with tokens that
write no KV and that no real token sees (a tree sequence's padding masks hold their own bit only;
a causal sequence's padding comes after every real token), and the wanted logits are gathered from
the graph's rows.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from gossamer.cache.block_pool import NULL_BLOCK_ID
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.ops.base import AttentionMetadata, DecodeAdvance
from gossamer.runner.host_copy import UploadFence, to_device
from gossamer.runner.step_buffers import StepBuffers

DEFAULT_GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Graphs of multi-token steps (speculative verification: 1 + k tokens per sequence) keep all
# their logits, [batch * (1 + k), vocab] float32; larger batches fall back to eager.
MAX_MULTI_TOKEN_GRAPH_SEQS = 32
# A tree graph's sequences share one int64 bitmask per token (bit 63, the sign, unused).
MAX_TREE_QUERY_LEN = 63
# Plain-decode graphs end with each token's greedy pick (`greedy_ids`; at batch 1 the unembedding
# GEMV makes it, elsewhere an argmax in the graph), and a step fed those picks reads them there.
# What it would save at batch 1, where the fed step is unembedding -> argmax kernel (+ memset) ->
# input upload -> copy of the picks into the input buffer -> torch's embedding kernel: 31 us from
# the unembedding's end to the next step's first norm in the 20b graph (graph_timeline.py, H200,
# 2026-12-04). Measured -12 us a 20b step (fusion_ab greedy_in_graph, H200, 2026-12-05); on since
# the twentieth session. GOSSAMER_GREEDY_IN_GRAPH=0 turns it (and ADVANCE_IN_GRAPH) off.
GREEDY_IN_GRAPH = os.environ.get("GOSSAMER_GREEDY_IN_GRAPH", "1") == "1"
# Graphs of at most CONTEXT_GRAPH_MAX_TOKENS tokens are also captured per context bucket (`ops`'s
# decode_context_bounds of at least CONTEXT_GRAPH_MIN_LEN), and a step replays the first whose
# bound holds its longest sequence. Why: attention sizes its key splits by the max_seq_len a graph
# was captured with, and the server captures at max_model_len (131k: 64 splits at batch 1 where
# an uncaptured 1k step launches 16); the empty splits exit early, but they are launched, and the
# in-kernel merge loads all of a power of two of them, masked. Shorter contexts than the minimum
# keep the smallest bucket; larger batches launch the same splits at every context past it. The
# 131k graph cost +7 us (20b) / +20 us (120b) a 1k step and the buckets took it back (fusion_ab
# graph_131k / context_graphs, H200, 2026-12-05); on since the twentieth session,
# GOSSAMER_CONTEXT_GRAPHS=0 turns it off. The token bound caps the copies' float32 logits (8 rows).
CONTEXT_GRAPHS = os.environ.get("GOSSAMER_CONTEXT_GRAPHS", "1") == "1"
# With GREEDY_IN_GRAPH, the batch-1 decode graphs also advance their inputs (ops.base.DecodeAdvance,
# in the unembedding's last program: no launch of its own), and a step whose inputs the device
# then holds uploads nothing. What it would save: the upload between two replays, 2.6 us of copy
# in the 20b timeline (graph_timeline.py, H200, 2026-12-04) with 6.4 us idle between steps in
# all; at long contexts the step's block tables grow that copy (4 bytes a block a group).
# With the pick in the graph, -21 us a 20b step (-9 us of them this) and -12 us a 120b step
# (fusion_ab advance_in_graph, H200, 2026-12-05); on since the twentieth session (env 0: off).
ADVANCE_IN_GRAPH = os.environ.get("GOSSAMER_ADVANCE_IN_GRAPH", "1") == "1"
CONTEXT_GRAPH_MIN_LEN = 512
CONTEXT_GRAPH_MAX_TOKENS = 8

# How a step ran (ModelRunner.step_modes, EngineStats.runner_steps): replayed a captured graph, or
# ran eagerly for the reason named. An eager step launches every kernel from Python (milliseconds).
GRAPH = "graph"
EAGER_NO_GRAPHS = "eager_no_graphs"  # nothing captured: CPU, torch ops, cuda_graphs off
EAGER_PREFILL = "eager_prefill"  # some sequence feeds tokens it wants no logits for (prompt chunk)
EAGER_MIXED = "eager_mixed_query_lens"  # all logits wanted, but query lengths differ
EAGER_NO_GRAPH_FOR_SHAPE = "eager_no_graph_for_shape"  # uniform, but no graph of that batch and q
EAGER_TREE = "eager_tree"  # tree speculation step that no tree graph holds (batch, tokens, context)


@dataclass
class SeqInput:
    """One sequence's share of a step."""

    token_ids: list[int]  # tokens fed this step
    start: int  # position of token_ids[0] (= tokens already in the KV cache)
    block_tables: tuple  # per cache group, list or int32 array; entry i holds positions i*bs..
    num_logits: int = 1  # logits wanted for the last num_logits fed tokens (0 mid-prefill)
    # Tree speculation: per fed token, its attention bitmask over the fed tokens (see
    # AttentionMetadata.tree_mask); the token runs at position start + popcount - 1 but keeps its
    # slot start + index. None: a causal sequence.
    tree_mask: tuple[int, ...] | None = None


def uniform_query_len(seqs: list[SeqInput]) -> int | None:
    """q when every sequence feeds q tokens and wants all q logits (q = 1: plain decode; q = 1 + k:
    verification of k drafts), the only steps a captured graph replays; None otherwise."""
    q = len(seqs[0].token_ids) if seqs else 0
    if q == 0 or any(len(seq.token_ids) != q or seq.num_logits != q for seq in seqs):
        return None
    return q


def plan_step(
    seqs: list[SeqInput],
    graph_keys: Collection[tuple[int, int]],
    tree_query_len: int | None = None,
    max_model_len: int | None = None,
) -> tuple[tuple[int, int] | None, str]:
    """(graph key, GRAPH) when a graph of `graph_keys` ((batch size, q) pairs) can replay the
    step, the smallest whose batch holds it; else (None, the EAGER_* reason). The graphs of q =
    `tree_query_len` hold a tree mask and replay padded steps (module doc; `fits_tree_graph`)."""
    if not graph_keys:
        return None, EAGER_NO_GRAPHS
    tree = any(seq.tree_mask is not None for seq in seqs)
    q = uniform_query_len(seqs)
    if q is not None and not tree:
        size = _smallest_graph(graph_keys, len(seqs), q)
        if size is not None:
            return (size, q), GRAPH
    if tree_query_len is not None and fits_tree_graph(seqs, tree_query_len, max_model_len):
        size = _smallest_graph(graph_keys, len(seqs), tree_query_len)
        if size is not None:
            return (size, tree_query_len), GRAPH
    if tree:
        return None, EAGER_TREE
    if q is None:
        prefill = any(seq.num_logits != len(seq.token_ids) for seq in seqs)
        return None, EAGER_PREFILL if prefill else EAGER_MIXED
    return None, EAGER_NO_GRAPH_FOR_SHAPE


def _short_span_slots(table, start: int, end: int, block_size: int) -> range | list[int]:
    """The cache slots of positions start..end - 1 by the block table `table`: a range when they
    lie in one block."""
    first, last = start // block_size, (end - 1) // block_size
    if first == last:
        base = int(table[first]) * block_size - first * block_size
        return range(base + start, base + end)
    blocks = [int(block) for block in table[first : last + 1]]
    return [
        blocks[p // block_size - first] * block_size + p % block_size for p in range(start, end)
    ]


def _smallest_graph(graph_keys: Collection[tuple[int, int]], num_seqs: int, q: int) -> int | None:
    return min(
        (size for size, length in graph_keys if length == q and size >= num_seqs), default=None
    )


def fits_tree_graph(seqs: list[SeqInput], tree_query_len: int, max_model_len: int | None) -> bool:
    """Whether a tree graph of `tree_query_len` tokens per sequence holds the step once padded:
    every sequence feeds at most that many and has room for the padding before max_model_len
    (padding tokens take the positions after the real ones: rope table, block table width)."""
    return bool(seqs) and all(
        1 <= len(seq.token_ids) <= tree_query_len
        and (max_model_len is None or seq.start + tree_query_len <= max_model_len)
        for seq in seqs
    )


class ModelRunner:
    def __init__(
        self,
        model: GptOssForCausalLM,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        cuda_graphs: bool = True,
        graph_sizes: tuple[int, ...] = DEFAULT_GRAPH_SIZES,
        graph_query_lens: tuple[int, ...] = (1,),
        tree_query_len: int | None = None,
        warmup: bool = True,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        """`tree_query_len`: tokens per sequence of the tree graphs (module doc), a tree
        verification step's 1 + nodes; None: no tree graphs (and no warm-up of tree kernels).
        `kv_cache_dtype`: the cache's element type (None: the model's dtype)."""
        if tree_query_len is not None and not 1 <= tree_query_len <= MAX_TREE_QUERY_LEN:
            raise ValueError(
                f"tree_query_len must be 1..{MAX_TREE_QUERY_LEN}, not {tree_query_len}"
            )
        self.model = model
        self.tree_query_len = tree_query_len
        self.block_size = block_size
        self.device = model.device
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size, kv_cache_dtype)
        self.max_num_seqs = max_num_seqs
        self.max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.max_blocks_per_seq = -(-model.max_model_len // block_size)
        self.num_groups = model.num_cache_groups
        self._allocate_buffers()
        # keyed by (number of sequences, tokens per sequence)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.graph_logits: dict[tuple[int, int], torch.Tensor] = {}
        self.step_modes: Counter[str] = Counter()  # steps run, by GRAPH / EAGER_* reason
        # per graph, the extra outputs of `_forward` ([graph tokens, ...] each), as graph_logits
        self.graph_extras: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        self.last_extras: tuple[torch.Tensor, ...] = ()  # the last step's, one row per fed token
        if warmup and triton_on_gpu(model):
            # NOTE: imported here because warmup.py imports this module. The cache is still empty,
            # but the warm-up writes none of it anyway (runner/warmup.py).
            from gossamer.runner.warmup import warm_up

            warm_up(self)
        if graphs_possible(model, cuda_graphs):
            sizes = [b for b in graph_sizes if b <= max_num_seqs]
            tree_lens = () if tree_query_len is None else (tree_query_len,)
            self.capture_graphs(sizes, (*graph_query_lens, *tree_lens))

    # ---- buffers -------------------------------------------------------------------------------

    def _allocate_buffers(self) -> None:
        # `host`: numpy views of the step's inputs, which `_fill` writes; `dev`: their device
        # twins, whose addresses the graphs hold. Both are views of StepBuffers' one buffer,
        # laid out per step size (`_lay_out`).
        sizes = (self.max_tokens, self.max_num_seqs, self.num_groups, self.max_blocks_per_seq)
        # (read once: the graphs are captured with them)
        self.greedy_in_graph = GREEDY_IN_GRAPH
        self.advance_in_graph = GREEDY_IN_GRAPH and ADVANCE_IN_GRAPH
        self.inputs = StepBuffers(*sizes, self.device, track_device=self.advance_in_graph)
        self._lay_out(self.max_tokens, self.max_num_seqs)
        self.upload_fence = UploadFence(self.device)
        self._width = 1  # block-table columns the current step uses
        # run(device_input_ids=...): ids that `_upload` copies over the first rows, device to device
        self._device_input_ids: torch.Tensor | None = None
        self._device_input_rows: torch.Tensor | None = None  # their rows, when not the first
        # The greedy picks of the last plain-decode graph (GREEDY_IN_GRAPH), one per graph token:
        # `last_greedy` after its replay. Fed back as `device_input_ids`, they stay here: the
        # upload marks their tokens -1 and the embedding reads them from this buffer (Ops.embed).
        self.greedy_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self.last_greedy: torch.Tensor | None = None
        self.num_fed_in_place = 0  # steps fed greedy_ids as they were
        # per graph key, its context-bucket graphs (CONTEXT_GRAPHS): (bound, graph, logits,
        # extras), ascending bounds, all below max_model_len (the key's own graph's)
        self.context_graphs: dict[tuple[int, int], list[tuple[int, Any, torch.Tensor, tuple]]] = {}
        self.capture_context_graphs = CONTEXT_GRAPHS

    def _lay_out(self, num_tokens: int, num_seqs: int) -> None:
        """Points `host` and `dev` at the views of a step of this size (a graph's: its padded
        size), which the next fill writes and the next upload copies."""
        self._layout = (num_tokens, num_seqs)
        self.host, self.dev = self.inputs.views(num_tokens, num_seqs)

    def _fill(self, seqs: list[SeqInput]) -> tuple[int, list[int], int, int]:
        """Write the step into the host arrays, packed; returns (num_tokens, logits rows, max q,
        max kv). Sets self._width: the longest block table of the step (what must be uploaded)."""
        self.upload_fence.wait()
        starts, seq_lens = self.host["query_start_loc"], self.host["seq_lens"]
        cursor, rows, max_query, max_seq = 0, [], 0, 0
        starts[0] = 0
        self._width = 1
        for i, seq in enumerate(seqs):
            n, end = len(seq.token_ids), seq.start + len(seq.token_ids)
            self._write_seq(i, seq, cursor)
            rows.extend(range(cursor + n - seq.num_logits, cursor + n))
            cursor += n
            starts[i + 1] = cursor
            seq_lens[i] = end
            max_query, max_seq = max(max_query, n), max(max_seq, end)
        return cursor, rows, max_query, max_seq

    def _write_seq(self, i: int, seq: SeqInput, cursor: int) -> None:
        """Sequence i's tokens, positions and slots from token `cursor` on, and its block tables;
        widens self._width to its tables."""
        bs, host = self.block_size, self.host
        input_ids, positions, slots = host["input_ids"], host["positions"], host["slot_mapping"]
        n, end = len(seq.token_ids), seq.start + len(seq.token_ids)
        if n == 1:  # decode: scalar work beats building numpy arrays
            input_ids[cursor] = seq.token_ids[0]
            positions[cursor] = seq.start
            for g, table in enumerate(seq.block_tables):
                slots[g, cursor] = table[seq.start // bs] * bs + seq.start % bs
        elif n <= bs:  # verification (1 + k tokens): at most two blocks, Python ranges
            input_ids[cursor : cursor + n] = seq.token_ids
            positions[cursor : cursor + n] = range(seq.start, end)
            for g, table in enumerate(seq.block_tables):
                slots[g, cursor : cursor + n] = _short_span_slots(table, seq.start, end, bs)
        else:
            span = np.arange(seq.start, end)
            input_ids[cursor : cursor + n] = seq.token_ids
            positions[cursor : cursor + n] = span
            for g, table in enumerate(seq.block_tables):
                table = np.asarray(table, dtype=np.int64)
                slots[g, cursor : cursor + n] = table[span // bs] * bs + span % bs
        for g, table in enumerate(seq.block_tables):
            # NOTE: entries past the table's length keep stale ids; kernels never read them.
            host["block_tables"][g, i, : len(table)] = table
            self._width = max(self._width, len(table))

    def _upload(self) -> None:
        """The step's inputs to the device in one copy (StepBuffers), queued without waiting for
        the stream on the GPU; then the fence that the next fill waits for."""
        ids, self._device_input_ids = self._device_input_ids, None  # used by one upload only
        rows, self._device_input_rows = self._device_input_rows, None
        in_place = self.greedy_in_graph and ids is not None and rows is None
        in_place = in_place and self._is_greedy_prefix(ids)
        if in_place:  # the embedding reads them from greedy_ids (Ops.embed)
            self.host["input_ids"][: ids.numel()] = -1
            self.num_fed_in_place += 1
        if self.inputs.upload(*self._layout, self._width):  # (not when the device holds them)
            self.upload_fence.record()
        if ids is not None and rows is not None:  # a tree graph's layout (`_replay_tree`)
            self.dev["input_ids"].index_copy_(0, rows[: ids.numel()], ids)
            self.inputs.forget()
        elif ids is not None and not in_place:
            self.dev["input_ids"][: ids.numel()].copy_(ids)
            self.inputs.ids_unknown(*self._layout, ids.numel())

    def _is_greedy_prefix(self, ids: torch.Tensor) -> bool:
        """Whether `ids` is greedy_ids[:k] itself (the last graph's `last_greedy`, fed as it is)."""
        return ids.is_contiguous() and ids.data_ptr() == self.greedy_ids.data_ptr()

    def _metadata(
        self, num_tokens: int, num_seqs: int, max_query: int, max_seq: int, host_lens: bool
    ) -> AttentionMetadata:
        dev = self.dev
        seq_lens_host: tuple[int, ...] = ()
        query_lens_host: tuple[int, ...] = ()
        if host_lens:
            seq_lens_host = tuple(self.host["seq_lens"][:num_seqs].tolist())
            query_lens_host = tuple(np.diff(self.host["query_start_loc"][: num_seqs + 1]).tolist())
        return AttentionMetadata(
            query_start_loc=dev["query_start_loc"][: num_seqs + 1],
            seq_lens=dev["seq_lens"][:num_seqs],
            slot_mapping=tuple(dev["slot_mapping"][g, :num_tokens] for g in range(self.num_groups)),
            block_tables=tuple(dev["block_tables"][g, :num_seqs] for g in range(self.num_groups)),
            max_query_len=max_query,
            max_seq_len=max_seq,
            query_lens_host=query_lens_host,
            seq_lens_host=seq_lens_host,
        )

    # ---- execution -----------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self, seqs: list[SeqInput], device_input_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run one step; returns float32 logits [sum of num_logits, vocab] in sequence order.

        `device_input_ids` ([k] int64, on the model's device): the input ids of the first k fed
        tokens, which replace theirs in `seqs` (placeholders) by a device-to-device copy. The
        overlapped engine step feeds the previous step's sampled tokens this way, never reading
        them on the host (engine/overlap.py)."""
        self.last_extras, self.last_greedy = (), None
        if not seqs:
            return torch.empty(0, self.model.config.vocab_size, device=self.device)
        if len(seqs) > self.max_num_seqs:
            raise ValueError(f"{len(seqs)} sequences exceed max_num_seqs={self.max_num_seqs}")
        num_tokens = sum(len(seq.token_ids) for seq in seqs)
        if num_tokens > self.max_tokens:
            raise ValueError(f"{num_tokens} tokens exceed the step budget of {self.max_tokens}")
        self._device_input_ids = device_input_ids
        key, mode = self.plan(seqs)
        self.step_modes[mode] += 1
        if key is not None and key[1] == self.tree_query_len:
            return self._replay_tree(key, seqs)
        self._lay_out(*((key[0] * key[1], key[0]) if key is not None else (num_tokens, len(seqs))))
        _, rows, max_query, max_seq = self._fill(seqs)
        if key is not None:
            return self._replay(key, len(seqs), max_seq)
        logits, self.last_extras = self._run_eager(seqs, num_tokens, rows, max_query, max_seq)
        return logits

    def plan(self, seqs: list[SeqInput]) -> tuple[tuple[int, int] | None, str]:
        """`plan_step` with this runner's graphs: (the graph key, GRAPH) or (None, why eager)."""
        return plan_step(seqs, self.graphs, self.tree_query_len, self.model.max_model_len)

    @torch.inference_mode()
    def dry_run(self, seqs: list[SeqInput]) -> None:
        """An eager step that stores no KV (every slot -1) and keeps nothing: the start-up warm-up
        (runner/warmup.py) runs its kernels, with the launch shapes of `seqs`, to compile them."""
        self._lay_out(sum(len(seq.token_ids) for seq in seqs), len(seqs))
        num_tokens, rows, max_query, max_seq = self._fill(seqs)
        self.host["slot_mapping"][:, :num_tokens] = -1
        self._run_eager(seqs, num_tokens, rows, max_query, max_seq)

    def _run_eager(
        self, seqs: list[SeqInput], num_tokens: int, rows: list[int], max_query: int, max_seq: int
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """After `_fill` (its results are the arguments): the step, eagerly -> (logits of `rows`,
        the extras of `_forward`)."""
        tree = self._fill_tree(seqs)
        self._upload()
        metadata = self._metadata(num_tokens, len(seqs), max_query, max_seq, host_lens=True)
        if tree:
            self._add_tree_mask(metadata, num_tokens)
        hidden, extras = self._forward(
            self.dev["input_ids"][:num_tokens], self.dev["positions"][:num_tokens], metadata
        )
        return self.model.compute_logits(hidden[to_device(rows, self.device)]), extras

    def _fill_tree(self, seqs: list[SeqInput]) -> bool:
        """Tree speculation, packed: the tree tokens' masks and depth positions into the host
        arrays (mask 0 for the other tokens). False, writing nothing, for a step without trees."""
        if all(seq.tree_mask is None for seq in seqs):
            return False
        cursor = 0
        for seq in seqs:
            self._write_tree_mask(seq, cursor)
            cursor += len(seq.token_ids)
        return True

    def _write_tree_mask(self, seq: SeqInput, cursor: int) -> None:
        """The sequence's tree masks (0s for a causal one) from token `cursor` on, and its tree
        tokens' depth positions (AttentionMetadata.tree_mask)."""
        n = len(seq.token_ids)
        if seq.tree_mask is None:
            self.host["tree_mask"][cursor : cursor + n] = 0
            return
        self.host["tree_mask"][cursor : cursor + n] = seq.tree_mask
        depths = [mask.bit_count() - 1 for mask in seq.tree_mask]
        self.host["positions"][cursor : cursor + n] = np.add(seq.start, depths)

    def _add_tree_mask(self, metadata: AttentionMetadata, num_tokens: int) -> None:
        """The tree masks (uploaded with the step's other inputs) into `metadata`."""
        metadata.tree_mask = self.dev["tree_mask"][:num_tokens]
        metadata.tree_mask_host = tuple(self.host["tree_mask"][:num_tokens].tolist())

    def _forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The step's final hidden states [T, hidden] and its extra outputs, [T, ...] each
        (`last_extras` after `run`). The same call runs eagerly and inside a captured graph, so a
        subclass that returns extras (EAGLE-3's aux hidden states) gets them from replays too."""
        return self.model(input_ids, positions, metadata, self.kv_cache, **self.fed_kwargs()), ()

    def fed_kwargs(self) -> dict:
        """The model's `fed_ids` argument where steps may read their ids from greedy_ids (with
        GREEDY_IN_GRAPH; stand-in models of the benchmarks take none otherwise)."""
        return {"fed_ids": self.greedy_ids} if self.greedy_in_graph else {}

    def _pad(self, num_seqs: int, graph_size: int, q: int) -> None:
        """Padding sequences of q tokens at positions 0..q-1: no KV write, the null block; their
        logits are ignored."""
        self.upload_fence.wait()  # a no-op after `_fill`; graph capture starts a step here
        width = -(-q // self.block_size)
        self._width = max(self._width, width)
        host = self.host
        host["query_start_loc"][0] = 0  # (a capture fills nothing else)
        if num_seqs == graph_size:
            return  # the graph's own batch: nothing to pad
        first, end = num_seqs * q, graph_size * q
        host["input_ids"][first:end] = 0
        host["positions"][first:end] = np.tile(np.arange(q), graph_size - num_seqs)
        host["slot_mapping"][:, first:end] = -1
        host["tree_mask"][first:end] = 0  # causal (read by tree graphs only)
        host["block_tables"][:, num_seqs:graph_size, :width] = NULL_BLOCK_ID
        host["query_start_loc"][num_seqs + 1 : graph_size + 1] = (
            np.arange(num_seqs + 1, graph_size + 1) * q
        )
        host["seq_lens"][num_seqs:graph_size] = q

    def _replay(self, key: tuple[int, int], num_seqs: int, max_seq: int) -> torch.Tensor:
        size, q = key
        self._pad(num_seqs, size, q)
        self._upload()
        graph, logits, extras = self._graph_for(key, max_seq)
        graph.replay()
        if self._advances(size, q):
            self.inputs.advanced(*self._layout, self.block_size)
        num_tokens = num_seqs * q  # the rows of padding sequences are left out
        self.last_extras = tuple(extra[:num_tokens] for extra in extras)
        if self._picks_greedy(q):
            self.last_greedy = self.greedy_ids[:num_tokens]
        return logits[:num_tokens]

    def _graph_for(self, key: tuple[int, int], max_seq: int) -> tuple[Any, torch.Tensor, tuple]:
        """(graph, its logits, its extras) to replay a step of `key` whose longest sequence is
        max_seq long: the first context bucket that holds it, else the key's own graph."""
        for bound, graph, logits, extras in self.context_graphs.get(key, ()):
            if max_seq <= bound:
                return graph, logits, extras
        return self.graphs[key], self.graph_logits[key], self.graph_extras.get(key, ())

    def _fill_tree_graph(
        self, seqs: list[SeqInput], size: int, q: int
    ) -> tuple[list[int], list[int]]:
        """Sequence i at graph tokens i*q .. (i+1)*q of a graph of `size` sequences, padded at its
        end (module doc); returns the graph rows of the wanted logits and of the fed tokens, in
        sequence order."""
        self.upload_fence.wait()
        self._lay_out(size * q, size)
        host = self.host
        self._width = 1
        logit_rows, token_rows = [], []
        for i, seq in enumerate(seqs):
            first, n = i * q, len(seq.token_ids)
            self._write_seq(i, seq, first)
            self._write_tree_mask(seq, first)
            self._pad_tree_seq(i, seq, first + n, first + q)
            host["query_start_loc"][i + 1] = first + q
            host["seq_lens"][i] = seq.start + q
            token_rows.extend(range(first, first + n))
            logit_rows.extend(range(first + n - seq.num_logits, first + n))
        return logit_rows, token_rows

    def _pad_tree_seq(self, i: int, seq: SeqInput, begin: int, end: int) -> None:
        """Tokens begin..end pad sequence i (whose own tokens end at begin): they write no KV,
        and no real token sees them: a tree sequence's padding masks hold their own bit only
        (depth 0), a causal sequence's padding takes the positions after its tokens."""
        host, n = self.host, len(seq.token_ids)
        host["input_ids"][begin:end] = 0
        host["slot_mapping"][:, begin:end] = -1
        index = np.arange(n, n + end - begin)  # the padding's query indices in the sequence
        if seq.tree_mask is None:
            host["tree_mask"][begin:end] = 0
            host["positions"][begin:end] = seq.start + index
        else:
            host["tree_mask"][begin:end] = np.left_shift(1, index)
            host["positions"][begin:end] = seq.start
        # NOTE: attention loads the keys of every query index, the padding's (masked out) too:
        # table entries past the sequence's own point at the null block (zeros, never written).
        width = -(-(seq.start + n + end - begin) // self.block_size)
        for g, table in enumerate(seq.block_tables):
            host["block_tables"][g, i, len(table) : width] = NULL_BLOCK_ID
        self._width = max(self._width, width)

    def _replay_tree(self, key: tuple[int, int], seqs: list[SeqInput]) -> torch.Tensor:
        """Replay the tree graph `key` for `seqs` (each at most key[1] tokens): the wanted
        logits, and the extras of the fed tokens, in sequence order as an eager step gives them."""
        size, q = key
        logit_rows, token_rows = self._fill_tree_graph(seqs, size, q)
        self._pad(len(seqs), size, q)
        tokens = to_device(token_rows, self.device)
        self._device_input_rows = tokens
        self._upload()
        # (padded, each sequence takes q positions from its start)
        graph, logits, extras = self._graph_for(key, max(seq.start for seq in seqs) + q)
        graph.replay()
        self.last_extras = tuple(extra[tokens] for extra in extras)
        return logits[to_device(logit_rows, self.device)]

    def capture_graphs(
        self,
        sizes: list[int],
        query_lens: tuple[int, ...] = (1,),
        capture: GraphCapture | EagerGraphCapture | None = None,
    ) -> None:
        """Capture one graph per (batch size, tokens per sequence), largest first so that they
        share one memory pool. `capture`: EagerGraphCapture() tests this path on the CPU."""
        capture = capture or GraphCapture()
        query_lens = tuple(dict.fromkeys(query_lens))  # the tree graphs' q may be a chain's too
        keys = [(size, q) for q in query_lens for size in sizes if size * q <= self.max_tokens]
        keys = [(b, q) for b, q in keys if q == 1 or b <= MAX_MULTI_TOKEN_GRAPH_SEQS]
        for size, q in sorted(keys, key=lambda key: key[0] * key[1], reverse=True):
            # NOTE: attention sizes its split-K grid from max_seq_len; the context bound keeps one
            # graph valid for every context length.
            graph, logits, extras = self._capture_one(capture, size, q, self.model.max_model_len)
            self.graphs[(size, q)] = graph
            self.graph_logits[(size, q)] = logits
            self.graph_extras[(size, q)] = extras
        for size, q in keys:
            if self.capture_context_graphs and size * q <= CONTEXT_GRAPH_MAX_TOKENS:
                self.context_graphs[(size, q)] = [
                    (bound, *self._capture_one(capture, size, q, bound))
                    for bound in self._context_bounds(size, q)
                ]
        capture.finish()

    def _capture_one(
        self, capture: GraphCapture | EagerGraphCapture, size: int, q: int, max_seq_len: int
    ) -> tuple[Any, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(graph, logits, extras) of `size` sequences of q tokens, attention launched for
        contexts up to max_seq_len (any context replays correctly: only the split count differs)."""
        num_tokens, tree = size * q, q == self.tree_query_len
        self._width = 1
        self._lay_out(num_tokens, size)
        self._pad(0, size, q)
        self._upload()
        metadata = self._metadata(num_tokens, size, q, max_seq_len, False)
        if tree:  # read on the device only (no host copy), so it is every replay's
            metadata.tree_mask = self.dev["tree_mask"][:num_tokens]
        ids = self.dev["input_ids"][:num_tokens]
        positions = self.dev["positions"][:num_tokens]
        greedy = self.greedy_ids[:num_tokens] if self._picks_greedy(q) else None
        if greedy is not None and self.device.type == "cuda":
            self._warm_greedy_pick(greedy)
        advance = self._decode_advance(size) if self._advances(size, q) else None
        graph, (logits, *extras) = capture.capture(
            partial(self._graph_step, ids, positions, metadata, greedy, advance)
        )
        self.inputs.forget()  # (the capture's own runs may have advanced them)
        return graph, logits, tuple(extras)

    def _advances(self, size: int, q: int) -> bool:
        """Whether the graphs of `size` sequences of q tokens advance their inputs: at batch 1,
        where the unembedding GEMV's pick does it in its last program (ADVANCE_IN_GRAPH)."""
        return self.advance_in_graph and size == 1 and self._picks_greedy(q)

    def _decode_advance(self, size: int) -> DecodeAdvance:
        """The current layout's inputs of a decode step of `size` sequences, to advance."""
        dev = self.dev
        return DecodeAdvance(
            positions=dev["positions"][:size],
            seq_lens=dev["seq_lens"][:size],
            slot_mapping=dev["slot_mapping"][:, :size],
            block_tables=dev["block_tables"][:, :size],
            block_size=self.block_size,
        )

    def _context_bounds(self, size: int, q: int) -> list[int]:
        """The context buckets of graphs of `size` sequences of q tokens (CONTEXT_GRAPHS)."""
        bounds = getattr(self.model.ops, "decode_context_bounds", None)  # (stand-ins have none)
        if bounds is None:
            return []
        heads, max_len = self.model.config.num_key_value_heads, self.model.max_model_len
        found = bounds(size, q, heads, max_len, self.device)
        return [bound for bound in found if bound >= CONTEXT_GRAPH_MIN_LEN]

    def _warm_greedy_pick(self, greedy: torch.Tensor) -> None:
        """One eager unembedding with the pick before its graph is captured: compiles the pick's
        kernel and makes its scratch (gemv._greedy_scratch) outside the capture."""
        hidden = torch.zeros(greedy.shape[0], self.model.config.hidden_size,
                             dtype=self.model.dtype, device=self.device)  # fmt: skip
        self.model.compute_logits(hidden, greedy_out=greedy)

    def _graph_step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        greedy: torch.Tensor | None = None,
        advance: DecodeAdvance | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """What a graph captures: logits of every fed token, then the extras of `_forward`; with
        `greedy` ([tokens] int64) also each token's greedy pick (the unembedding's, at batch 1),
        and with `advance` the step's inputs moved on after it."""
        hidden, extras = self._forward(input_ids, positions, metadata)
        if greedy is None:  # (stand-in models of the benchmarks take no greedy_out)
            return (self.model.compute_logits(hidden), *extras)
        kwargs = {} if advance is None else {"advance": advance}
        return (self.model.compute_logits(hidden, greedy_out=greedy, **kwargs), *extras)

    def _picks_greedy(self, query_len: int) -> bool:
        """Whether the graphs of this tokens-per-sequence pick greedily: plain decode only, the
        steps the overlapped engine feeds back (verification steps read their logits instead)."""
        return self.greedy_in_graph and query_len == 1 and query_len != self.tree_query_len


def graphs_possible(model, cuda_graphs: bool) -> bool:
    """Whether `model` (anything with `device` and `ops`) can run from captured CUDA graphs: asked
    for, on the GPU, with the Triton ops (the torch reference syncs with the host mid-step)."""
    return cuda_graphs and triton_on_gpu(model)


def triton_on_gpu(model) -> bool:
    """Whether `model` runs the Triton ops on the GPU: the only backend that compiles kernels as
    new launch shapes come (hence the start-up warm-up)."""
    return model.device.type == "cuda" and model.ops.name == "triton"


class GraphCapture:
    """Captures step functions as CUDA graphs that share one memory pool (capture the largest
    first). A step function reads persistent input buffers and returns a tuple of tensors."""

    def __init__(self) -> None:
        self.pool = None

    def capture(
        self, step: Callable[[], tuple[torch.Tensor, ...]]
    ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        """(graph, the tensors `step` returned): each `graph.replay()` rewrites them."""
        for _ in range(2):  # warm up: compile kernels and settle allocations
            step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = step()
        self.pool = graph.pool()
        return graph, outputs

    def finish(self) -> None:
        torch.cuda.synchronize()


class EagerGraphCapture:
    """GraphCapture's stand-in where CUDA graphs do not exist (CPU tests): a "replay" runs the
    step function again on the same persistent buffers and copies its results into the tensors
    the capture returned. Everything around the graph (keys, buffers, padding rows, slicing the
    outputs) then runs as it does on the GPU."""

    def capture(
        self, step: Callable[[], tuple[torch.Tensor, ...]]
    ) -> tuple[EagerReplay, tuple[torch.Tensor, ...]]:
        outputs = step()
        return EagerReplay(step, outputs), outputs

    def finish(self) -> None:
        return None


class EagerReplay:
    def __init__(
        self, step: Callable[[], tuple[torch.Tensor, ...]], outputs: tuple[torch.Tensor, ...]
    ) -> None:
        self.step, self.outputs = step, outputs
        self.num_replays = 0

    def replay(self) -> None:
        self.num_replays += 1
        for output, fresh in zip(self.outputs, self.step(), strict=True):
            output.copy_(fresh)
