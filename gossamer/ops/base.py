"""The op interface the model calls for its heavy work.

The model (gossamer/model/gpt_oss.py) never calls a kernel directly: it calls these methods on an `Ops`
object. `TorchOps` (ops/torch_ref.py) is the readable CPU implementation and the test oracle; the GPU
backend (ops/triton.py) implements the same methods with Triton kernels.

Token layout: every op works on a flat batch of tokens from many sequences ("varlen"), described by
`AttentionMetadata`. Sequence s owns query tokens query_start_loc[s]:query_start_loc[s+1]; its last
query token sits at position seq_lens[s] - 1, so query token j of a sequence with query length q sits at
position seq_lens[s] - q + j. (Tree speculation keeps that layout for the KV slots but computes the
tokens at the positions of their tree depths: `AttentionMetadata.tree_mask`.)

KV cache layout (gossamer/cache/layout.py decides it): cache groups share one block pool, the
full-attention layers in one group and the sliding-window layers in another (a group without layers
is left out, so a model of only sliding layers has a single group 0). Storage is one tensor
    kv_cache: [layers_per_group, 2, num_blocks, block_size, num_kv_heads, head_dim]
and layer l uses kv_cache[index_in_group(l)] (a [2, num_blocks, block_size, kv_heads, head_dim] view,
K at [0], V at [1]) with the block table and slot mapping of its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

# Group indices when a model has both kinds of layers (every published GPT-OSS model does).
FULL_GROUP = 0
SLIDING_GROUP = 1


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, on the model's device
    seq_lens: torch.Tensor  # [num_seqs] int32: context length after this step (cached + new)
    # Per cache group, in the order of KVCacheLayout.groups:
    slot_mapping: tuple[torch.Tensor, ...]  # [num_tokens] int64: block_id * block_size + offset
    block_tables: tuple[torch.Tensor, ...]  # [num_seqs, max_blocks_per_seq] int32; 0 = null block
    max_query_len: int
    max_seq_len: int
    # Host copies so that reference code can loop without device syncs.
    query_lens_host: tuple[int, ...] = ()
    seq_lens_host: tuple[int, ...] = ()
    # Tree speculation (gossamer/spec/tree.py); None in every other step. Per query token, 0 for
    # the usual causal rule, or a bitmask over its own sequence's query tokens of this step (bit
    # j: query token j, at most 63 of them) that replaces the causal rule inside the step: the
    # token sees the keys before the step plus the step's keys whose bit is set (itself and its
    # tree ancestors). Such a token's position (rope, sliding window) is first_pos + popcount - 1,
    # not first_pos + j; keys keep the slots of their query index.
    tree_mask: torch.Tensor | None = None  # [num_tokens] int64
    tree_mask_host: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass
class DecodeAdvance:
    """A plain-decode step's inputs (one token per sequence), which the step's last kernel moves
    on by one token once nothing else reads them: the next decode step's inputs when every
    sequence feeds its greedy pick, so that the runner uploads nothing then (ModelRunner's
    ADVANCE_IN_GRAPH). Rows whose group-0 slot is negative (padding) are left as they are; a
    row whose next position is past its table's columns gets slot -1."""

    positions: torch.Tensor  # [S] int64
    seq_lens: torch.Tensor  # [S] int32
    slot_mapping: torch.Tensor  # [G, S] int64
    block_tables: torch.Tensor  # [G, S, columns] int32
    block_size: int

    def apply(self) -> None:
        """The advance in torch ops: the reference, and the path where no kernel fuses it."""
        real = self.slot_mapping[0] >= 0
        positions = self.positions + real.long()
        columns = positions // self.block_size
        inside = columns < self.block_tables.shape[2]
        index = columns.clamp(max=self.block_tables.shape[2] - 1)
        index = index.expand(self.block_tables.shape[0], -1)[..., None]
        blocks = self.block_tables.gather(2, index)[..., 0].long()  # [G, S]
        slots = torch.where(inside, blocks * self.block_size + positions % self.block_size, -1)
        self.slot_mapping.copy_(torch.where(real, slots, self.slot_mapping))
        self.positions.copy_(positions)
        self.seq_lens.add_(real.to(self.seq_lens.dtype))


@dataclass
class ExpertWeights:
    """All experts of one MoE layer.

    MXFP4 (the published format): `*_blocks` [E, out, in/32, 16] uint8, two e2m1 values per byte,
    low nibble = even element; `*_scales` [E, out, in/32] uint8 e8m0 exponents (value = 2^(s-127)).
    Dense (bf16/fp32 checkpoints): `*_dense` [E, out, in]. Exactly one of the two forms is set.
    gate_up rows interleave gate (even rows) and up (odd rows).
    """

    gate_up_bias: torch.Tensor  # [E, 2 * intermediate]
    down_bias: torch.Tensor  # [E, hidden]
    gate_up_blocks: torch.Tensor | None = None  # [E, 2I, H/32, 16] uint8
    gate_up_scales: torch.Tensor | None = None  # [E, 2I, H/32] uint8
    down_blocks: torch.Tensor | None = None  # [E, H, I/32, 16] uint8
    down_scales: torch.Tensor | None = None  # [E, H, I/32] uint8
    gate_up_dense: torch.Tensor | None = None  # [E, 2I, H]
    down_dense: torch.Tensor | None = None  # [E, H, I]
    # bit layout of the blocks' int32 words: "hf" (published) or "fp16_lanes" (model/mxfp4.py;
    # the loader repacks to it for the Triton kernels on the GPU)
    layout: str = "hf"

    @property
    def is_mxfp4(self) -> bool:
        return self.gate_up_blocks is not None


class Ops(Protocol):
    """What a backend must implement. Shapes: T tokens, H hidden, Hq/Hkv heads, D head_dim."""

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x [T, in] @ weight[out, in].T + bias -> [T, out]."""
        ...

    def embed(
        self, input_ids: torch.Tensor, weight: torch.Tensor, fed_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """weight[input_ids] [T, H]; a negative input id stands for fed_ids at its position (a
        token the previous step picked on the device: ModelRunner's greedy ids)."""
        ...

    def logits(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        greedy_out: torch.Tensor | None = None,
        advance: DecodeAdvance | None = None,
    ) -> torch.Tensor:
        """The unembedding: linear(hidden, weight, None) in hidden's dtype, as float32 [T, vocab].
        `greedy_out` ([T] int64): also writes each row's argmax there (torch.argmax's pick).
        `advance` (with greedy_out): then moves the step's inputs on (DecodeAdvance)."""
        ...

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With a residual: h = x + residual; returns (rms_norm(h) * weight, h).
        Without: returns (rms_norm(x) * weight, x). The norm is computed in float32."""
        ...

    def norm_linear(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        want_normed: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """`rms_norm(hidden, norm_weight, eps, residual)` then `linear` of the normed [T, in]:
        returns (linear output [T, out], the normed [T, in] if want_normed else None, the new
        residual [T, in]). One op so that a backend can fold the norm into the projection that
        consumes it (results as the composition's, up to the float32 sum's order)."""
        ...

    def decode_context_bounds(
        self,
        num_seqs: int,
        query_len: int,
        num_kv_heads: int,
        max_seq_len: int,
        device: torch.device,
    ) -> list[int]:
        """Context lengths below max_seq_len at which a step of num_seqs sequences of query_len
        tokens each would launch its kernels differently (ascending): graphs captured at each
        bound serve shorter contexts as an uncaptured step would (model_runner's CONTEXT_GRAPHS).
        [] when launches do not depend on the context."""
        ...

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] (half-split, not interleaved) by the float32
        cos_sin [max_pos, D] table (cos in [:, :D/2], sin in [:, D/2:], YaRN scaling folded in)."""
        ...

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store k, v [T, Hkv, D] at slots of kv_cache [2, num_blocks, block_size, Hkv, D]."""
        ...

    def rope_and_write_kv(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """`rope` then `write_kv` of the rotated k and v; returns the rotated q [T, Hq, D]. One op
        so that a backend can fuse the two (one pass over the QKV output instead of three)."""
        ...

    def attention(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        group: int,
        sinks: torch.Tensor,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """Causal attention of q [T, Hq, D] over the paged cache (which already holds this step's
        keys). Per-head learned sinks [Hq] join the softmax as an extra logit and are dropped after.
        A sliding window w lets position p see keys p-w+1..p. With `metadata.tree_mask`, tree
        tokens see the keys before the step and their tree ancestors only (see the field).
        Returns [T, Hq, D]."""
        ...

    def rope_write_kv_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        metadata: AttentionMetadata,
        group: int,
        sinks: torch.Tensor,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """`rope_and_write_kv` then `attention` of the rotated q: un-rotated q, k, v in, the
        attention output [T, Hq, D] out, the rotated k and v left in the cache. One op so that a
        backend can do the rotation and the cache write inside its decode attention kernel."""
        ...

    def moe(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        experts: ExpertWeights,
        top_k: int,
        swiglu_limit: float,
        swiglu_alpha: float,
    ) -> torch.Tensor:
        """Route each token of x [T, H] to the top_k experts of router_logits [T, E] (softmax over
        the chosen logits), apply the clamped SwiGLU experts and sum with the routing weights."""
        ...

    def norm_moe(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        router_weight: torch.Tensor,
        router_bias: torch.Tensor,
        experts: ExpertWeights,
        top_k: int,
        swiglu_limit: float,
        swiglu_alpha: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's second half: `norm_linear` of the router (want_normed) then `moe` of the
        normed x with those logits; returns (the MoE output [T, H], the new residual). One op so
        that a backend can fuse the norm, the router and the routing (decode)."""
        ...


def compose_norm_linear(
    ops: Ops,
    hidden: torch.Tensor,  # [T, in]
    residual: torch.Tensor | None,  # [T, in]
    norm_weight: torch.Tensor,  # [in]
    eps: float,
    weight: torch.Tensor,  # [out, in]
    bias: torch.Tensor | None,  # [out]
    want_normed: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`Ops.norm_linear` as its two parts on `ops`: the unfused path."""
    normed, new_residual = ops.rms_norm(hidden, norm_weight, eps, residual)
    return ops.linear(normed, weight, bias), normed if want_normed else None, new_residual


def compose_norm_moe(
    ops: Ops,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Ops.norm_moe` as its parts on `ops`: the unfused path."""
    router_logits, x, new_residual = ops.norm_linear(
        hidden, residual, norm_weight, eps, router_weight, router_bias, want_normed=True
    )
    return ops.moe(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha), new_residual
