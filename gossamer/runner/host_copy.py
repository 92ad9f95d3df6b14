"""Host-to-device copies that do not make the host wait for the GPU.

A copy from pageable (ordinary) host memory waits until the stream has run everything queued before
it: CUDA has to stage the bytes itself. A copy from pinned (page-locked) memory with
`non_blocking=True` is queued like a kernel and the host moves on. That is what lets the engine
launch step N + 1 while step N still runs (engine/overlap.py). The price: the host must not rewrite
a pinned buffer before the copies that read it have run (`UploadFence`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(
    values: Sequence[int] | Sequence[float], device: torch.device, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """A 1-D tensor of `values` on `device`, without waiting for the stream on CUDA. The pinned
    copy comes from PyTorch's caching host allocator, which keeps it until the copy has run."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    host = torch.tensor(values, dtype=dtype, pin_memory=True)
    return host.to(device, non_blocking=True)


def host_buffer(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, fill: int = 0
) -> torch.Tensor:
    """A persistent host tensor for uploads to `device`: pinned for a CUDA device (pinning needs
    CUDA), ordinary memory otherwise."""
    return torch.full(shape, fill, dtype=dtype, pin_memory=device.type == "cuda")


class UploadFence:
    """Guards persistent pinned buffers against being rewritten while copies that read them are
    still queued: `record()` after a step's uploads, `wait()` before the next step writes them.

    NOTE: one buffer and one event rather than two buffers in turn. In the overlapped engine, by
    the time the host fills step N + 1 it has already waited for step N - 1's sampled tokens, and
    step N's uploads were queued right behind them, so `wait()` returns at once; a second set of
    buffers would only add memory and bookkeeping. Without overlap the host waited for step N's
    tokens, so nothing is pending at all. On the CPU copies are synchronous and there is no event.
    """

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event() if device.type == "cuda" else None
        self.pending = False  # recorded and not yet waited for

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
            self.pending = True

    def wait(self) -> None:
        if self.pending:
            self.event.synchronize()
            self.pending = False
