"""Helpers shared by the tests and benchmarks: where the shared test data lives, and a fresh
interpreter for compiling kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The folder with o200k_base.tiktoken and the Harmony special tokens (`GOSSAMER_DATA_DIR`,
    default: `../shared/data` beside the checkout)."""
    return Path(os.environ.get("GOSSAMER_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))


def run_compiling(script: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a Python snippet in a fresh interpreter that compiles Triton kernels (sm_90 and the like
    on a CPU): without TRITON_INTERPRET, which the test process sets, and with benchmarks/ on the
    path for its scripts."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "benchmarks"), str(REPO_ROOT)])
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
