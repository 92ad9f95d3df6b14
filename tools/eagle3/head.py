"""The EAGLE-3 draft head as a trainable module, and its training-time-test unroll.

`DraftHead` is the training twin of `gossamer.spec.eagle3.Eagle3Head`: the same parameter names
(so the state dict is the published checkpoint layout), the same function (tests compare it with the
engine's head through the paged cache), but over [B, L] batches with autograd instead of a paged
KV cache. The token embedding is the target's, frozen and not saved (the engine shares the target's
when a checkpoint has none).

Training-time test (TTT, the EAGLE-3 recipe): the head is unrolled for `steps` steps over every
position at once, as the engine drafts. Chain p starts at position p, whose input is token p + 1
and the target's aux hidden states at p; step j of chain p sits at position p + j, reads token
p + 1 + j and the head's own pre-norm output of step j - 1, and predicts token p + 2 + j. Its
attention sees what the engine's would: the step-0 keys of positions 0..p (computed from target
features) and the keys of steps 1..j of its own chain (one key each, at positions p + 1..p + j).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from gossamer.spec.eagle3 import Eagle3Config, llama_cos_sin_table
from tools.mini.model import RMSNorm, apply_rope


def eagle3_hf_config(
    *,
    vocab_size: int,
    draft_vocab_size: int,
    hidden_size: int,
    aux_layer_ids: tuple[int, ...],
    num_attention_heads: int = 8,
    num_key_value_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 1024,
    max_position_embeddings: int = 4096,
    rope_theta: float = 10000.0,
) -> dict:
    """config.json of a head for a target of `hidden_size` (the head shares its embedding, so
    its width is the target's)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": hidden_size,
        "norm_before_residual": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)},
    }


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width, dim = 2 * config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            dim,
        )
        self.q_proj = nn.Linear(width, self.heads * dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(self.heads * dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, L, 2H]
        cos: torch.Tensor,  # [L, D/2] at this step's positions
        sin: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],  # (k, v) [B, heads, L, D] of steps < j
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeat = self.heads // self.kv_heads  # query head h reads kv head h // repeat
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = ttt_attention(q, [*past, (k, v)], self.head_dim**-0.5)
        out = out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
        return self.o_proj(out), (k, v)


def ttt_attention(
    q: torch.Tensor,  # [B, heads, L, D]
    keys_values: list[tuple[torch.Tensor, torch.Tensor]],  # per step, [B, heads, L, D] each
    scale: float,
) -> torch.Tensor:
    """Query p attends causally to step 0's keys 0..p and to key p of every later step."""
    (k0, v0), later = keys_values[0], keys_values[1:]
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k0.transpose(-1, -2)).float() * scale  # [B, heads, L, L]
    scores = scores.masked_fill(~causal, float("-inf"))
    diagonal = [(q * k).sum(-1, keepdim=True).float() * scale for k, _ in later]  # [B, h, L, 1]
    weights = torch.cat([scores, *diagonal], dim=-1).softmax(-1).to(q.dtype)
    out = weights[..., :length] @ v0
    for i, (_, v) in enumerate(later):
        out = out + weights[..., length + i, None] * v
    return out


class _Mlp(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = _Mlp(config)


class DraftHead(nn.Module):
    """Parameters named as in the checkpoint; `embed` (the target's embedding) is not saved."""

    def __init__(
        self,
        config: Eagle3Config,
        embedding: torch.Tensor,  # [vocab, H] the target's token embedding
        draft_ids: torch.Tensor,  # [draft_vocab] target token id of each draft token id
        max_positions: int,
    ) -> None:
        super().__init__()
        if config.norm_before_residual:
            raise ValueError("this trainer writes heads with norm_before_residual = false")
        self.config = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        draft_ids = draft_ids.long().cpu()
        self.register_buffer("d2t", draft_ids - torch.arange(len(draft_ids)))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        self.register_buffer("t2d", t2d)
        # target id -> draft id, -1 outside the draft vocabulary (for losses)
        draft_index = torch.full((config.vocab_size,), -1, dtype=torch.long)
        draft_index[draft_ids] = torch.arange(len(draft_ids))
        self.register_buffer("draft_index", draft_index, persistent=False)
        self.register_buffer("draft_ids", draft_ids, persistent=False)
        self.register_buffer("embed", embedding.detach().clone(), persistent=False)
        self.register_buffer(
            "cos_sin", llama_cos_sin_table(config, max_positions, "cpu"), persistent=False
        )

    def step(
        self,
        token_ids: torch.Tensor,  # [B, L]
        hidden: torch.Tensor,  # [B, L, 3 * H_target] aux states, or [B, L, H] own pre-norm
        positions: torch.Tensor,  # [L]
        past: list[tuple[torch.Tensor, torch.Tensor]],
        from_target: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One head step: (normed [B, L, H], pre-norm [B, L, H], this step's (k, v))."""
        layer = self.midlayer
        if from_target:
            hidden = self.fc(hidden)
        embeds = layer.input_layernorm(self.embed[token_ids])
        normed_hidden = layer.hidden_norm(hidden)
        cos, sin = self.cos_sin[positions].chunk(2, dim=-1)
        attn, kv = layer.self_attn(torch.cat((embeds, normed_hidden), dim=-1), cos, sin, past)
        residual = attn + hidden
        prenorm = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        return self.norm(prenorm), prenorm, kv

    def unroll(
        self,
        token_ids: torch.Tensor,  # [B, W]
        aux: torch.Tensor,  # [B, W, 3 * H_target]
        steps: int,
    ) -> list[torch.Tensor]:
        """Training-time test: draft logits [B, W - steps, draft_vocab] of each step j, whose
        row p predicts token p + 2 + j (the target's prediction at position p + 1 + j)."""
        length = token_ids.shape[1] - steps
        hidden, past, logits = aux[:, :length], [], []
        positions = torch.arange(length, device=token_ids.device)
        for j in range(steps):
            normed, hidden, kv = self.step(
                token_ids[:, 1 + j : 1 + j + length], hidden, positions + j, past, j == 0
            )
            past.append(kv)
            logits.append(self.lm_head(normed))
        return logits

    @classmethod
    def load(cls, folder: Path, embedding: torch.Tensor, max_positions: int) -> DraftHead:
        """A head saved by `save` (float32 master weights from its bf16 copy)."""
        config = Eagle3Config.from_hf(json.loads((folder / "config.json").read_text()))
        tensors = load_file(folder / "model.safetensors")
        draft_ids = tensors["d2t"] + torch.arange(len(tensors["d2t"]))
        head = cls(config, embedding, draft_ids, max_positions)
        head.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
        )
        return head

    def save(self, folder: Path, hf_config: dict, dtype: torch.dtype = torch.bfloat16) -> Path:
        """config.json + model.safetensors in the published layout (weights in `dtype`)."""
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name, tensor in self.state_dict().items():
            floating = tensor.is_floating_point()
            tensors[name] = (tensor.to(dtype) if floating else tensor).detach().cpu().contiguous()
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(tensors, folder / "model.safetensors")
        return folder
