"""Models shipped inside the package."""

from __future__ import annotations

from pathlib import Path

from gossamer.config import ConfigError

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "gpt-oss-mini"


def default_model_path() -> Path:
    """The built-in model's checkpoint folder."""
    path = MODELS_DIR / DEFAULT_MODEL
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"the built-in model is not in this install ({path}); pass --model PATH or a preset "
            "with --load-format dummy"
        )
    return path
