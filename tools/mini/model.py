"""A training-only twin of transformers' GptOssForCausalLM, fast on one GPU.

It computes the same function as the Hugging Face model (tests/mini check logits to 1e-4 in
float32) and its state_dict uses the Hugging Face parameter names and layouts, so exporting is a
cast and a save. What differs is only how it computes, for training speed:
- packed fixed-length batches [B, T], no cache, no padding;
- attention is written out (softmax needs the sink column, which SDPA kernels cannot add);
- the MoE runs every expert on every token as two wide GEMMs, with the routing weights (zero for
  the experts not in a token's top-k) applied between them. With 16 experts and top-4 that is 4x
  the routed FLOPs, but it has no data-dependent shapes, no host syncs and compiles cleanly;
- optional dropout on the two residual branches (off in eval: not part of the exported function);
- optional MXFP4 fake quantisation of the expert weights (straight-through gradient), so the last
  steps train the exact weights the MXFP4 checkpoint will hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class MiniConfig:
    """The Hugging Face GptOssConfig fields the model needs (same names, same meaning)."""

    vocab_size: int = 8192
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 1
    head_dim: int = 64
    num_local_experts: int = 16
    num_experts_per_tok: int = 4
    intermediate_size: int = 64
    sliding_window: int = 128
    rope_theta: float = 150000.0
    rope_factor: float = 32.0
    rope_original_max_position_embeddings: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    # YaRN semantics: factor x original context (transformers warns otherwise), as GPT-OSS.
    max_position_embeddings: int = 131072
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    rms_norm_eps: float = 1e-5
    layer_types: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.layer_types:
            # As in GPT-OSS: the sliding window on even layers, full attention on odd ones.
            types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", types)
        if self.hidden_size % 32 or self.intermediate_size % 32:
            raise ValueError("MXFP4 experts need hidden_size and intermediate_size divisible by 32")


# --- RoPE (YaRN) -------------------------------------------------------------------------------


def yarn_inverse_frequencies(config: MiniConfig) -> tuple[torch.Tensor, float]:
    """([head_dim/2] float32, attention scaling): transformers' YaRN with truncate=False."""
    dim, base = config.head_dim, config.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (config.rope_factor * pos_freqs)

    def dim_for_rotations(rotations: float) -> float:
        turns = config.rope_original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(turns) / (2 * math.log(base))

    low = max(dim_for_rotations(config.rope_beta_fast), 0)
    high = min(dim_for_rotations(config.rope_beta_slow), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    inv_freq = interpolation * ramp + extrapolation * (1 - ramp)
    scaling = 0.1 * math.log(config.rope_factor) + 1.0 if config.rope_factor > 1 else 1.0
    return inv_freq, scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos, sin [T, D/2]. Half-split (not interleaved) rotation."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


# --- MXFP4 fake quantisation -------------------------------------------------------------------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_round_trip(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """The values an MXFP4 checkpoint holds for `weight` (blocks of 32 along `dim`).

    Same rule as gossamer.model.mxfp4.quantize (tests hold them equal): the block scale is the
    smallest power of two that brings the block's largest magnitude within 6, and elements round
    to the nearest e2m1 value with ties to the smaller magnitude. Applied to the bfloat16 value of
    the weight, as the bfloat16 checkpoint is what gets quantized."""
    moved = weight.detach().to(torch.bfloat16).float().movedim(dim, -1)
    grouped = moved.unflatten(-1, (-1, 32))  # [..., G, 32]
    amax = grouped.abs().amax(dim=-1, keepdim=True)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent))
    scale = torch.exp2(exponent)
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=weight.device)
    scaled = (grouped.abs() / scale).clamp(max=6.0)
    nearest = (scaled.unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)  # first minimum: ties down
    values = magnitudes[nearest] * torch.sign(grouped) * scale
    return values.flatten(-2).movedim(-1, dim).to(weight.dtype)


def straight_through(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """Forward: the MXFP4 value; backward: identity (the straight-through estimator)."""
    return weight + (mxfp4_round_trip(weight, dim) - weight).detach()


# --- Modules (named like transformers' so state_dict keys match the checkpoint) -----------------


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dtype)


class Attention(nn.Module):
    """GQA with per-head sinks; the caller passes the layer's mask (sliding or full)."""

    def __init__(self, config: MiniConfig) -> None:
        super().__init__()
        self.config = config
        heads, kv_heads, head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size)
        self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(
        self,
        x: torch.Tensor,  # [B, T, hidden]
        cos: torch.Tensor,  # [T, head_dim/2]
        sin: torch.Tensor,
        mask: torch.Tensor,  # [T, T] additive: 0 or -inf
    ) -> torch.Tensor:
        cfg = self.config
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, cfg.num_attention_heads, cfg.head_dim)
        k = self.k_proj(x).view(batch, length, cfg.num_key_value_heads, cfg.head_dim)
        v = self.v_proj(x).view(batch, length, cfg.num_key_value_heads, cfg.head_dim)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, H, T, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, KV, T, D]
        v = v.transpose(1, 2)
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        # [B, KV, group*T, D] x [B, KV, D, T]: GQA without materialising repeated keys.
        q = q.reshape(batch, cfg.num_key_value_heads, group * length, cfg.head_dim)
        scores = (q @ k.transpose(-1, -2)).float() * cfg.head_dim**-0.5
        scores = scores.view(batch, cfg.num_attention_heads, length, length) + mask
        sinks = self.sinks.float().view(1, -1, 1, 1).expand(batch, -1, length, 1)
        logits = torch.cat((scores, sinks), dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1]  # the sink column only takes mass
        probs = probs.to(v.dtype).reshape(batch, cfg.num_key_value_heads, group * length, length)
        out = (probs @ v).view(batch, cfg.num_attention_heads, length, cfg.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Router(nn.Module):
    def __init__(self, config: MiniConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.num_local_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(config.num_local_experts))


class Experts(nn.Module):
    def __init__(self, config: MiniConfig) -> None:
        super().__init__()
        experts, hidden, inter = (
            config.num_local_experts,
            config.hidden_size,
            config.intermediate_size,
        )
        # Hugging Face layouts: [E, in, out]; gate and up interleaved on the last axis.
        self.gate_up_proj = nn.Parameter(torch.zeros(experts, hidden, 2 * inter))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(experts, 2 * inter))
        self.down_proj = nn.Parameter(torch.zeros(experts, inter, hidden))
        self.down_proj_bias = nn.Parameter(torch.zeros(experts, hidden))


class MoE(nn.Module):
    def __init__(self, config: MiniConfig) -> None:
        super().__init__()
        self.config = config
        self.router = Router(config)
        self.experts = Experts(config)
        self.fake_quantize = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (out [N, hidden], router logits [N, E] for the balance loss)."""
        cfg, experts = self.config, self.experts
        num_experts, inter = cfg.num_local_experts, cfg.intermediate_size
        logits = F.linear(x, self.router.weight, self.router.bias)  # [N, E]
        top_values, top_index = logits.topk(cfg.num_experts_per_tok, dim=-1)
        top_weights = torch.softmax(top_values.float(), dim=-1)
        routing = torch.zeros_like(logits, dtype=torch.float32).scatter(1, top_index, top_weights)
        gate_up_w, down_w = experts.gate_up_proj, experts.down_proj
        if self.fake_quantize:
            gate_up_w, down_w = straight_through(gate_up_w, 1), straight_through(down_w, 1)
        # Every expert on every token: [N, hidden] @ [hidden, E*2I].
        gate_up_all = gate_up_w.permute(1, 0, 2).reshape(cfg.hidden_size, -1)
        gate_up = (x @ gate_up_all).view(-1, num_experts, 2 * inter) + experts.gate_up_proj_bias
        activated = clamped_swiglu(gate_up, cfg.swiglu_limit, cfg.swiglu_alpha)  # [N, E, I]
        weighted = activated * routing.unsqueeze(-1).to(activated.dtype)
        # Sum over experts inside one GEMM: [N, E*I] @ [E*I, hidden].
        out = weighted.reshape(-1, num_experts * inter) @ down_w.reshape(-1, cfg.hidden_size)
        out = out + routing.to(out.dtype) @ experts.down_proj_bias.to(out.dtype)
        return out, logits


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


class DecoderLayer(nn.Module):
    def __init__(self, config: MiniConfig, dropout: float) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MoE(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.dropout(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        batch, length, hidden = x.shape
        moe_out, router_logits = self.mlp(self.post_attention_layernorm(x).view(-1, hidden))
        x = x + self.dropout(moe_out.view(batch, length, hidden))
        return x, router_logits


class Backbone(nn.Module):
    def __init__(self, config: MiniConfig, dropout: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, dropout) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MiniGptOss(nn.Module):
    """state_dict() keys and shapes are exactly those of transformers' GptOssForCausalLM."""

    def __init__(self, config: MiniConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config, dropout)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        inv_freq, scaling = yarn_inverse_frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scaling = scaling

    def set_fake_quantize(self, enabled: bool) -> None:
        for layer in self.model.layers:
            layer.mlp.fake_quantize = enabled

    def rope_tables(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=self.inv_freq.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos = (angles.cos() * self.rope_scaling).to(dtype)
        sin = (angles.sin() * self.rope_scaling).to(dtype)
        return cos, sin

    def masks(self, length: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Additive [T, T] masks: causal, and causal within the last `sliding_window` keys."""
        query = torch.arange(length, device=device)[:, None]
        key = torch.arange(length, device=device)[None, :]
        causal = key <= query
        window = causal & (key > query - self.config.sliding_window)
        blocked = torch.tensor(float("-inf"), device=device)
        zero = torch.tensor(0.0, device=device)
        return {
            FULL: torch.where(causal, zero, blocked),
            SLIDING: torch.where(window, zero, blocked),
        }

    def hidden_states(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids [B, T] -> (final normed hidden [B, T, hidden], router logits per layer)."""
        length = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_tables(length, x.dtype)
        masks = self.masks(length, x.device)
        router_logits = []
        for layer, layer_type in zip(self.model.layers, self.config.layer_types, strict=True):
            x, logits = layer(x, cos, sin, masks[layer_type])
            router_logits.append(logits)
        return self.model.norm(x), router_logits

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab]."""
        hidden, _ = self.hidden_states(input_ids)
        return self.lm_head(hidden)


def load_balance_loss(router_logits: list[torch.Tensor], top_k: int) -> torch.Tensor:
    """Switch-transformer balance loss, averaged over layers: E * sum_e(f_e * P_e), where f_e is
    the share of top-k slots expert e receives and P_e its mean router probability (1 * top_k
    when routing is uniform). Training only: not part of the exported function."""
    total = torch.zeros((), device=router_logits[0].device)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)  # [N, E]
        chosen = torch.zeros_like(probs).scatter(1, logits.topk(top_k, dim=-1).indices, 1.0)
        fraction = chosen.mean(0)  # tokens per expert, each token counted top_k times
        total = total + probs.shape[-1] * (fraction * probs.mean(0)).sum()
    return total / len(router_logits)


def init_weights(model: MiniGptOss, std: float = 0.02, seed: int = 0) -> None:
    """GPT-2 style: N(0, std) matrices, output projections shrunk by sqrt(2 * layers)."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = std / math.sqrt(2 * model.config.num_hidden_layers)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            values = torch.ones_like(param)
        elif name.endswith(("bias", "sinks")):
            values = torch.zeros_like(param)
        elif name.endswith(("o_proj.weight", "experts.down_proj")):
            values = torch.randn(param.shape, generator=generator) * residual_std
        else:
            values = torch.randn(param.shape, generator=generator) * std
        with torch.no_grad():
            param.copy_(values)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
