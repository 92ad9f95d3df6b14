"""Helpers shared by the tests and benchmarks: where the shared test data lives."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The folder with o200k_base.tiktoken and the Harmony special tokens (`GOSSAMER_DATA_DIR`,
    default: `../shared/data` beside the checkout)."""
    return Path(os.environ.get("GOSSAMER_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
