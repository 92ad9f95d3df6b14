"""Op backends: `torch` (reference, any device) and `triton` (CUDA). `auto` picks Triton on CUDA."""

from __future__ import annotations

import torch

from gossamer.ops.base import Ops
from gossamer.ops.torch_ref import TorchOps

BACKENDS = ("auto", "torch", "triton")


def get_ops(name: str, device: torch.device | str) -> Ops:
    if name not in BACKENDS:
        raise ValueError(f"unknown op backend {name!r}; choose one of {BACKENDS}")
    on_cuda = torch.device(device).type == "cuda"
    if name == "triton" or (name == "auto" and on_cuda and _triton_available()):
        from gossamer.ops.triton import TritonOps

        return TritonOps()
    return TorchOps()


def _triton_available() -> bool:
    try:
        import gossamer.ops.triton  # noqa: F401
    except ImportError:
        return False
    return True
