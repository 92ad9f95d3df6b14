"""Pure-torch implementation of the op interface: readable, runs anywhere, and the oracle that the
Triton kernels are tested against."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gossamer.model import mxfp4
from gossamer.ops.base import (
    AttentionMetadata,
    DecodeAdvance,
    ExpertWeights,
    compose_norm_linear,
    compose_norm_moe,
)


class TorchOps:
    name = "torch"

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def embed(
        self, input_ids: torch.Tensor, weight: torch.Tensor, fed_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if fed_ids is not None:
            input_ids = torch.where(input_ids < 0, fed_ids[: input_ids.shape[0]], input_ids)
        return weight[input_ids]

    def decode_context_bounds(
        self,
        num_seqs: int,
        query_len: int,
        num_kv_heads: int,
        max_seq_len: int,
        device: torch.device,
    ) -> list[int]:
        return []  # the same computation at any context

    def logits(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        greedy_out: torch.Tensor | None = None,
        advance: DecodeAdvance | None = None,
    ) -> torch.Tensor:
        out = F.linear(hidden, weight).float()
        if greedy_out is not None:
            greedy_out.copy_(out.argmax(dim=-1))
        if advance is not None:
            advance.apply()
        return out

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = x if residual is None else x + residual
        h32 = hidden.float()
        normed = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
        return (weight.float() * normed).to(x.dtype), hidden

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
        return compose_norm_linear(
            self, hidden, residual, norm_weight, eps, weight, bias, want_normed
        )

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
        return compose_norm_moe(self, hidden, residual, norm_weight, eps, router_weight,
                                router_bias, experts, top_k, swiglu_limit, swiglu_alpha)  # fmt: skip

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        table = cos_sin[positions]  # [T, D]
        cos, sin = table.chunk(2, dim=-1)  # [T, D/2] each
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        keep = slot_mapping >= 0  # -1 marks tokens whose KV is not stored (padding)
        slots = slot_mapping[keep]
        _, num_blocks, block_size, heads, dim = kv_cache.shape
        flat = kv_cache.view(2, num_blocks * block_size, heads, dim)
        flat[0, slots] = _to_cache(k[keep], kv_cache.dtype)
        flat[1, slots] = _to_cache(v[keep], kv_cache.dtype)

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
        q, k = self.rope(q, k, positions, cos_sin)
        self.write_kv(k, v, kv_cache, slot_mapping)
        return q

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
        out = torch.empty_like(q)
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens_host or tuple(metadata.seq_lens.tolist())
        block_table = metadata.block_tables[group]
        tree_masks = _tree_masks_host(metadata)
        for seq, seq_len in enumerate(seq_lens):
            begin, end = starts[seq], starts[seq + 1]
            if end == begin:
                continue
            tree_mask = tree_masks[begin:end] if any(tree_masks[begin:end]) else None
            out[begin:end] = _sequence_attention(
                q[begin:end],
                kv_cache,
                block_table[seq],
                seq_len,
                sinks,
                scale,
                sliding_window,
                tree_mask,
            )
        return out

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
        q = self.rope_and_write_kv(q, k, v, positions, cos_sin, kv_cache, slot_mapping)
        return self.attention(q, kv_cache, metadata, group, sinks, scale, sliding_window)

    def moe(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        experts: ExpertWeights,
        top_k: int,
        swiglu_limit: float,
        swiglu_alpha: float,
    ) -> torch.Tensor:
        top_logits, top_ids = torch.topk(router_logits, top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top_logits, dim=-1)
        out = torch.zeros_like(x)
        for expert in torch.unique(top_ids).tolist():
            token_idx, slot = torch.where(top_ids == expert)
            gate_up_w, down_w = expert_matrices(experts, expert, x.dtype)
            gate_up = F.linear(x[token_idx], gate_up_w, experts.gate_up_bias[expert])
            hidden = swiglu(gate_up, swiglu_limit, swiglu_alpha)
            y = F.linear(hidden, down_w, experts.down_bias[expert])
            out.index_add_(0, token_idx, y * weights[token_idx, slot, None].to(y.dtype))
        return out


def swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU over interleaved [..., 2I] gate/up -> [..., I]."""
    gate = gate_up[..., 0::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def expert_matrices(
    experts: ExpertWeights, expert: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's (gate_up [2I, H], down [H, I]) in `dtype`, dequantized if packed."""
    if experts.is_mxfp4:
        gate_up_blocks, down_blocks = experts.gate_up_blocks[expert], experts.down_blocks[expert]
        if experts.layout != mxfp4.LAYOUT_HF:  # repacked for the GPU kernels (raises if unknown)
            gate_up_blocks = mxfp4.repack(gate_up_blocks, experts.layout, mxfp4.LAYOUT_HF)
            down_blocks = mxfp4.repack(down_blocks, experts.layout, mxfp4.LAYOUT_HF)
        gate_up = mxfp4.dequantize(gate_up_blocks, experts.gate_up_scales[expert], dtype)
        down = mxfp4.dequantize(down_blocks, experts.down_scales[expert], dtype)
        return gate_up, down
    return experts.gate_up_dense[expert].to(dtype), experts.down_dense[expert].to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)  # [T, heads, D/2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def _to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in the cache's dtype; into fp8, saturated at its largest finite value (as the Triton
    kernels' conversions are) rather than left to the cast's handling of out-of-range values."""
    if dtype.itemsize == 1 and dtype.is_floating_point:
        limit = torch.finfo(dtype).max
        x = x.clamp(-limit, limit)
    return x.to(dtype)


def _tree_masks_host(metadata: AttentionMetadata) -> Sequence[int]:
    """Per query token its tree bitmask (0: causal); empty in a step without trees."""
    if metadata.tree_mask is None:
        return ()
    return metadata.tree_mask_host or metadata.tree_mask.tolist()


def _sequence_attention(
    q: torch.Tensor,  # [q_len, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
    sinks: torch.Tensor,  # [Hq]
    scale: float,
    sliding_window: int | None,
    tree_mask: Sequence[int] | None = None,  # [q_len] ancestor bitmasks (AttentionMetadata)
) -> torch.Tensor:
    q_len, num_heads, dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    first_query_pos = seq_len - q_len
    # NOTE: only keys some query can see are gathered; in a sliding group older blocks may be null.
    key_start = 0 if sliding_window is None else max(0, first_query_pos - sliding_window + 1)
    key_pos = torch.arange(key_start, seq_len, device=q.device)
    slots = block_table[key_pos // block_size].long() * block_size + key_pos % block_size
    flat = kv_cache.flatten(1, 2)  # [2, slots, Hkv, D]
    keys, values = flat[0, slots].float(), flat[1, slots].float()  # [K, Hkv, D]
    group = num_heads // num_kv_heads
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale  # [Hq, q_len, K]
    query_pos = torch.arange(first_query_pos, seq_len, device=q.device)
    if tree_mask is None:
        visible = key_pos[None, :] <= query_pos[:, None]
    else:
        visible, query_pos, key_pos = _tree_visibility(tree_mask, key_pos, first_query_pos)
    if sliding_window is not None:
        visible &= query_pos[:, None] - key_pos[None, :] < sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    sink_column = sinks.float()[:, None, None].expand(num_heads, q_len, 1)
    probs = torch.softmax(torch.cat((scores, sink_column), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("hqk,khd->qhd", probs, values)
    return out.to(q.dtype)


def _tree_visibility(
    tree_mask: Sequence[int],  # [q_len] ancestor bitmasks
    key_pos: torch.Tensor,  # [K] the slots' positions
    first_query_pos: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(visible [q_len, K], query positions [q_len], key positions [K]) of a tree step: keys
    before the step are seen by all, the step's keys by the tokens whose mask has their bit; a
    step token sits at first_query_pos + its depth (popcount - 1), as query and as key."""
    device = key_pos.device
    bits = torch.tensor(list(tree_mask), dtype=torch.int64, device=device)
    depths = torch.tensor([mask.bit_count() - 1 for mask in tree_mask], device=device)
    query_pos = first_query_pos + depths
    in_step = key_pos >= first_query_pos
    step_index = (key_pos - first_query_pos).clamp_min(0)  # [K] query index of a step key
    ancestor = (bits[:, None] >> step_index[None, :]) & 1 == 1
    visible = ancestor | ~in_step[None, :]
    key_depths = depths[step_index.clamp_max(len(bits) - 1)]
    key_pos = torch.where(in_step, first_query_pos + key_depths, key_pos)
    return visible, query_pos, key_pos
