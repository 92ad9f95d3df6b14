"""Built-in model configurations: the official values of the published GPT-OSS checkpoints."""

from __future__ import annotations

from gossamer.config import ConfigError, ModelConfig

# <|return|>, <|endoftext|>, <|call|>: the stop set of the published generation_config.json.
GPT_OSS_EOS = (200002, 199999, 200012)

PRESETS: dict[str, ModelConfig] = {
    "gpt-oss-120b": ModelConfig(
        num_hidden_layers=36, num_local_experts=128, eos_token_ids=GPT_OSS_EOS, pad_token_id=199999
    ),
    "gpt-oss-20b": ModelConfig(
        num_hidden_layers=24, num_local_experts=32, eos_token_ids=GPT_OSS_EOS, pad_token_id=199999
    ),
}


def preset(name: str) -> ModelConfig:
    """The config of a built-in model by name (`gpt-oss-120b`, `gpt-oss-20b`, with or without `openai/`)."""
    key = name.removeprefix("openai/")
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[key]
