"""Frozen configuration dataclasses.

`ModelConfig` mirrors the fields of a Hugging Face GPT-OSS `config.json`; the other configs describe
how the engine runs it. Everything here is plain data: no tensors, no devices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"


class ConfigError(ValueError):
    """A config.json (or a preset name) that Gossamer cannot run."""


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters as GPT-OSS publishes them."""

    factor: float = 32.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # NOTE: GPT-OSS sets truncate=False: the YaRN correction range keeps its fractional ends.
    truncate: bool = False


@dataclass(frozen=True)
class ModelConfig:
    num_hidden_layers: int = 36
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 64
    vocab_size: int = 201088
    sliding_window: int = 128
    layer_types: tuple[str, ...] = ()
    rope_theta: float = 150000.0
    rope_scaling: RopeScaling | None = field(default_factory=RopeScaling)
    max_position_embeddings: int = 131072
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            # The published models put the sliding window on even layers.
            default = tuple(SLIDING if i % 2 == 0 else FULL for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", default)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise ConfigError(f"unknown layer types {sorted(unknown)}; expected {SLIDING}/{FULL}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf(cls, source: str | Path | dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face GPT-OSS config.json (a path to it, its folder, or the parsed dict)."""
        raw = source if isinstance(source, dict) else _read_json(source)
        model_type = raw.get("model_type", "gpt_oss")
        if model_type != "gpt_oss":
            raise ConfigError(f"model_type is {model_type!r}; Gossamer runs gpt_oss models only")
        known = {f.name for f in fields(cls)} - {"rope_scaling", "layer_types", "eos_token_ids"}
        kwargs: dict[str, Any] = {k: raw[k] for k in known if raw.get(k) is not None}
        # The original release spells the expert count `experts_per_token`.
        if "num_experts_per_tok" not in raw and "experts_per_token" in raw:
            kwargs["num_experts_per_tok"] = raw["experts_per_token"]
        if raw.get("layer_types"):
            kwargs["layer_types"] = tuple(raw["layer_types"])
        kwargs["eos_token_ids"] = _as_tuple(raw.get("eos_token_id"))
        rope = _rope_parameters(raw)
        kwargs["rope_scaling"] = rope[1]
        if rope[0] is not None:
            kwargs["rope_theta"] = rope[0]
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """The config.json that transformers' GptOssConfig reads back to this config."""
        rope = self.rope_scaling
        rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        if rope is not None:
            rope_parameters = {
                "rope_type": "yarn",
                "rope_theta": self.rope_theta,
                "factor": rope.factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings,
                "beta_fast": rope.beta_fast,
                "beta_slow": rope.beta_slow,
                "truncate": rope.truncate,
            }
        eos = list(self.eos_token_ids)
        return {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": True,
            "hidden_act": "silu",
            "num_hidden_layers": self.num_hidden_layers,
            "num_local_experts": self.num_local_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "experts_per_token": self.num_experts_per_tok,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "rope_theta": self.rope_theta,
            "rope_parameters": rope_parameters,
            "rope_scaling": None if rope is None else dict(rope_parameters),
            "initial_context_length": None
            if rope is None
            else rope.original_max_position_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "swiglu_limit": self.swiglu_limit,
            "swiglu_alpha": self.swiglu_alpha,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
        }


def _read_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json at {path}")
    return json.loads(path.read_text())


def _as_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list | tuple) else (int(value),)


def _rope_parameters(raw: dict[str, Any]) -> tuple[float | None, RopeScaling | None]:
    """(rope_theta, YaRN scaling) from either the transformers v4 or v5 spelling."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = params.get("rope_theta", raw.get("rope_theta"))
    rope_type = params.get("rope_type", params.get("type", "yarn" if params else "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise ConfigError(f"rope_type {rope_type!r} is not supported; GPT-OSS uses yarn")
    scaling = RopeScaling(
        factor=float(params.get("factor", 32.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw.get("initial_context_length", 4096))
        ),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
    )
    return theta, scaling
