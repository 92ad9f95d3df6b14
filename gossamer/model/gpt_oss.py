"""The GPT-OSS model in one file.

Per layer: RMSNorm -> attention (QKV with biases, GQA, YaRN RoPE, per-head learned sinks, a sliding
window of 128 on the even layers) -> residual -> RMSNorm -> MoE (router logits -> top-4 -> softmax over
those four -> clamped SwiGLU experts with biases) -> residual. Final RMSNorm and an untied unembedding.
The input norm is one op with the QKV projection (`Ops.norm_linear`), and the post-attention norm one
op with the router and the experts (`Ops.norm_moe`), so that a backend can fuse them.

Tensors are flat over tokens ([num_tokens, hidden]); sequences are told apart by `AttentionMetadata`.
Parameter names follow the Hugging Face checkpoints, except that q/k/v are fused into `qkv_proj`
(one GEMV instead of three at decode time; the loader concatenates them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gossamer.cache.layout import KVCacheLayout
from gossamer.config import ModelConfig
from gossamer.model.rope import cos_sin_table
from gossamer.ops.base import AttentionMetadata, DecodeAdvance, ExpertWeights, Ops


def _weight(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    # Uninitialised: weights come from a checkpoint or the dummy initialiser.
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def kv_cache_index(config: ModelConfig, layer: int) -> tuple[int, int]:
    """(cache group, index of the layer inside its group): the cache layout decides both."""
    return KVCacheLayout.from_model_config(config).layer_slots[layer]


def layers_per_group(config: ModelConfig) -> int:
    """First dimension of the KV cache tensor: the larger of the groups' layer counts."""
    return KVCacheLayout.from_model_config(config).layers_per_group


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: Ops, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        hidden, q_size, kv_size = config.hidden_size, config.q_size, config.kv_size
        self.qkv_proj = nn.Module()
        self.qkv_proj.weight = _weight(q_size + 2 * kv_size, hidden, dtype=dtype)
        self.qkv_proj.bias = _weight(q_size + 2 * kv_size, dtype=dtype)
        self.o_proj = nn.Module()
        self.o_proj.weight = _weight(hidden, q_size, dtype=dtype)
        self.o_proj.bias = _weight(hidden, dtype=dtype)
        self.sinks = _weight(config.num_attention_heads, dtype=torch.float32)
        self.group, self.cache_index = kv_cache_index(config, layer)
        self.sliding_window = config.sliding_window if config.is_sliding(layer) else None
        self.scale = config.head_dim**-0.5

    def forward(
        self,
        qkv: torch.Tensor,  # [T, q_size + 2 * kv_size]: the QKV projection of the normed input
        positions: torch.Tensor,  # [T]
        cos_sin: torch.Tensor,  # [max_pos, head_dim]
        metadata: AttentionMetadata,
        kv_cache: torch.Tensor,  # [layers_per_group, 2, blocks, block_size, kv_heads, head_dim]
    ) -> torch.Tensor:
        cfg, ops = self.config, self.ops
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_attention_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_key_value_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_key_value_heads, cfg.head_dim)
        layer_cache = kv_cache[self.cache_index]
        slot_mapping = metadata.slot_mapping[self.group]
        # one op, so that a backend can rotate and store the new K/V inside attention
        out = ops.rope_write_kv_attention(
            q, k, v, positions, cos_sin, layer_cache, slot_mapping,
            metadata, self.group, self.sinks, self.scale, self.sliding_window,
        )  # fmt: skip
        return ops.linear(out.flatten(1), self.o_proj.weight, self.o_proj.bias)


class Experts(nn.Module):
    """All experts of a layer, MXFP4-packed (published checkpoints, dummy weights) or dense."""

    def __init__(self, config: ModelConfig, mxfp4: bool, dtype: torch.dtype) -> None:
        super().__init__()
        num_experts, hidden = config.num_local_experts, config.hidden_size
        inter = config.intermediate_size
        self.mxfp4 = mxfp4
        self.blocks_layout = "hf"  # mxfp4.LAYOUT_*: the loader may repack for the GPU kernels
        self.gate_up_proj_bias = _weight(num_experts, 2 * inter, dtype=dtype)
        self.down_proj_bias = _weight(num_experts, hidden, dtype=dtype)
        if mxfp4:
            self.register_buffer("gate_up_proj_blocks", _blocks(num_experts, 2 * inter, hidden))
            self.register_buffer("gate_up_proj_scales", _scales(num_experts, 2 * inter, hidden))
            self.register_buffer("down_proj_blocks", _blocks(num_experts, hidden, inter))
            self.register_buffer("down_proj_scales", _scales(num_experts, hidden, inter))
        else:
            # NOTE: stored [E, out, in], the transpose of the Hugging Face [E, in, out] tensors.
            self.gate_up_proj = _weight(num_experts, 2 * inter, hidden, dtype=dtype)
            self.down_proj = _weight(num_experts, hidden, inter, dtype=dtype)

    def weights(self) -> ExpertWeights:
        if self.mxfp4:
            return ExpertWeights(
                gate_up_bias=self.gate_up_proj_bias,
                down_bias=self.down_proj_bias,
                gate_up_blocks=self.gate_up_proj_blocks,
                gate_up_scales=self.gate_up_proj_scales,
                down_blocks=self.down_proj_blocks,
                down_scales=self.down_proj_scales,
                layout=self.blocks_layout,
            )
        return ExpertWeights(
            gate_up_bias=self.gate_up_proj_bias,
            down_bias=self.down_proj_bias,
            gate_up_dense=self.gate_up_proj,
            down_dense=self.down_proj,
        )


def _blocks(num_experts: int, rows: int, cols: int) -> torch.Tensor:
    """MXFP4 blocks of a [rows, cols] matrix per expert: [E, rows, cols/32, 16] uint8."""
    return torch.empty(num_experts, rows, cols // 32, 16, dtype=torch.uint8)


def _scales(num_experts: int, rows: int, cols: int) -> torch.Tensor:
    """MXFP4 scales of a [rows, cols] matrix per expert: [E, rows, cols/32] uint8."""
    return torch.empty(num_experts, rows, cols // 32, dtype=torch.uint8)


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops, mxfp4: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.router = nn.Module()
        self.router.weight = _weight(config.num_local_experts, config.hidden_size, dtype=dtype)
        self.router.bias = _weight(config.num_local_experts, dtype=dtype)
        self.experts = Experts(config, mxfp4, dtype)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]: the attention output
        residual: torch.Tensor,  # [T, hidden]
        norm_weight: torch.Tensor,  # the post-attention norm's
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (the MoE output, the new residual)
        cfg = self.config
        return self.ops.norm_moe(
            hidden,
            residual,
            norm_weight,
            eps,
            self.router.weight,
            self.router.bias,
            self.experts.weights(),
            cfg.num_experts_per_tok,
            cfg.swiglu_limit,
            cfg.swiglu_alpha,
        )


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, ops: Ops, mxfp4: bool, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.ops = ops
        self.eps = config.rms_norm_eps
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = _weight(config.hidden_size, dtype=torch.float32)
        self.self_attn = Attention(config, layer, ops, dtype)
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = _weight(config.hidden_size, dtype=torch.float32)
        self.mlp = MoE(config, ops, mxfp4, dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        metadata: AttentionMetadata,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual stream it is to be added to); `residual` is None in
        the first layer, where `hidden` is the embedding."""
        attn, mlp = self.self_attn, self.mlp
        qkv, _, residual = self.ops.norm_linear(
            hidden, residual, self.input_layernorm.weight, self.eps,
            attn.qkv_proj.weight, attn.qkv_proj.bias, want_normed=False,
        )  # fmt: skip
        x = attn(qkv, positions, cos_sin, metadata, kv_cache)
        return mlp(x, residual, self.post_attention_layernorm.weight, self.eps)


class GptOssModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops, mxfp4: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _weight(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops, mxfp4, dtype) for i in range(config.num_hidden_layers)
        )
        self.norm = nn.Module()
        self.norm.weight = _weight(config.hidden_size, dtype=torch.float32)


class GptOssForCausalLM(nn.Module):
    """Build under `torch.device(...)` to allocate the weights there (meta for counting)."""

    def __init__(
        self,
        config: ModelConfig,
        ops: Ops,
        *,
        mxfp4: bool = True,
        dtype: torch.dtype = torch.bfloat16,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.dtype = dtype
        self.mxfp4 = mxfp4
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.model = GptOssModel(config, ops, mxfp4, dtype)
        self.lm_head = nn.Module()
        self.lm_head.weight = _weight(config.vocab_size, config.hidden_size, dtype=dtype)
        self.cos_sin: torch.Tensor | None = None  # built on first use, on the weights' device
        self._outgrown_rope_tables: list[torch.Tensor] = []  # (see rope_table)

    @property
    def num_cache_groups(self) -> int:
        return len(KVCacheLayout.from_model_config(self.config).groups)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def rope_table(self) -> torch.Tensor:
        """cos/sin of positions 0..max_model_len - 1, rebuilt when max_model_len has grown past
        it (a benchmark's runner for a longer context than the model was loaded for: positions
        past the table would be read out of bounds). NOTE: an outgrown table is kept, since
        graphs captured before still read it by address."""
        table = self.cos_sin
        if table is None or table.device != self.device or len(table) < self.max_model_len:
            if table is not None:
                self._outgrown_rope_tables.append(table)
            self.cos_sin = cos_sin_table(self.config, self.max_model_len, self.device)
        return self.cos_sin

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int
        positions: torch.Tensor,  # [T] int
        metadata: AttentionMetadata,
        kv_cache: torch.Tensor,
        aux_layers: Sequence[int] = (),
        fed_ids: torch.Tensor | None = None,  # [>= T] int64: ids of the tokens whose id is < 0
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Run all layers; returns the final-normed hidden states [T, hidden].

        With `aux_layers` (EAGLE-3 speculative decoding) it returns (hidden states, aux) where
        aux[i] [T, hidden] is the residual stream entering layer sorted(aux_layers)[i].
        `fed_ids`: where input_ids holds -1, the token is fed_ids at that position (Ops.embed: the
        runner feeds the previous step's greedy picks this way)."""
        inner = self.model
        hidden = self.ops.embed(input_ids, inner.embed_tokens.weight, fed_ids)
        cos_sin = self.rope_table()
        residual = None
        aux: list[torch.Tensor] = []
        for index, layer in enumerate(inner.layers):
            if index in aux_layers:
                aux.append(hidden if residual is None else hidden + residual)
            hidden, residual = layer(hidden, residual, positions, cos_sin, metadata, kv_cache)
        hidden, _ = self.ops.rms_norm(hidden, inner.norm.weight, self.config.rms_norm_eps, residual)
        return (hidden, aux) if aux_layers else hidden

    def compute_logits(
        self,
        hidden: torch.Tensor,
        greedy_out: torch.Tensor | None = None,
        advance: DecodeAdvance | None = None,
    ) -> torch.Tensor:
        """[N, hidden] -> float32 [N, vocab]; with `greedy_out` ([N] int64) each row's argmax too,
        and with `advance` the decode step's inputs moved on after it (Ops.logits)."""
        return self.ops.logits(hidden, self.lm_head.weight, greedy_out, advance)

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        cfg = self.config
        shape = (
            layers_per_group(cfg),
            2,
            num_blocks,
            block_size,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        return torch.zeros(shape, dtype=dtype or self.dtype, device=self.device)
