"""A step's inputs in one buffer, so that the step uploads them with one copy.

Every non-blocking host-to-device copy costs the host a PyTorch dispatch and a cudaMemcpyAsync
(about 10 us each on the H200 machine's host, profiled); a step used to upload its inputs in seven
or eight copies, which decided the pace of small models' overlapped decode steps. Here all of a
step's inputs are views into one byte buffer on the host (pinned on the GPU) and its twin on the
device, laid out by the step's token count T and sequence count S and packed from offset 0:

    int64: input_ids [T] | positions [T] | tree_mask [T] | slot_mapping [G, T (even)]
    int32: query_start_loc [S + 1] | seq_lens [S] | block_tables [max_blocks, G, S (of 16)]

The block tables come last and block-major: the first W columns of every table are one run, so
what a step uses is a prefix of the buffer, and one copy of that prefix moves the whole step
(the attention kernel takes the tables' block stride). Every field and every group's row starts
at a multiple of ALIGN bytes and the block stride is a multiple of 16 entries (the counts in
parentheses are padded to that), so the kernels' pointer-alignment and stride specializations
are the same in every layout: steps of new sizes compile nothing new.

A layout's views never move: a graph captured on (T, S)'s views reads the inputs of every replay
there. Steps of other sizes lay theirs out over the same memory; they run one after another on
the stream, and `UploadFence` keeps the host from rewriting the buffer under a queued copy.

What the device holds (`track_device=True`): a host copy of the bytes the last upload sent, which
`advanced` moves on as a graph that advances its inputs (ops.base.DecodeAdvance) does on the
device. `upload` skips the copy when the step's bytes are those already: a decode step fed its
greedy picks in place then uploads nothing. Ids the host cannot know (a device-side copy) are
marked UNKNOWN, which no step writes, so they never match.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gossamer.ops.base import DecodeAdvance
from gossamer.runner.host_copy import host_buffer

ALIGN = 16  # bytes: what Triton specializes pointers on
Layout = tuple[int, int]  # (tokens, sequences)
Views = tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]  # (host arrays, device tensors)
UNKNOWN = -2  # an input id no step writes (ids >= -1): the device's is not known


class StepBuffers:
    """Host and device views of one step's inputs (`views`), uploaded as one prefix (`upload`)."""

    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        num_groups: int,
        max_blocks: int,
        device: torch.device,
        track_device: bool = False,
    ) -> None:
        self.num_groups, self.max_blocks = num_groups, max_blocks
        self._views: dict[Layout, Views] = {}
        self._tables_offsets: dict[Layout, int] = {}  # (computed once: `upload` runs every step)
        size = self._tables_offset(max_tokens, max_seqs) + self._tables_bytes(max_blocks, max_seqs)
        self.host_bytes = host_buffer((size,), torch.uint8, device)
        # NOTE: copy=True keeps them apart on the CPU too, so that CPU tests see what is uploaded
        self.dev_bytes = self.host_bytes.to(device, copy=True)
        # (track_device) the device's bytes as the host knows them, and whose layout's they are and
        # how many (None: not known)
        self.on_device = np.zeros(size, dtype=np.uint8) if track_device else None
        self._device_holds: tuple[Layout, int] | None = None
        self._held_views: dict[Layout, dict[str, torch.Tensor]] = {}  # of on_device, by layout
        self.num_skipped = 0  # uploads left out: the device held the step's bytes

    def _fields(self, tokens: int, seqs: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        groups = self.num_groups
        return [
            ("input_ids", torch.int64, (tokens,)),
            ("positions", torch.int64, (tokens,)),
            ("tree_mask", torch.int64, (tokens,)),
            ("slot_mapping", torch.int64, (groups, -(-tokens // 2) * 2)),
            ("query_start_loc", torch.int32, (seqs + 1,)),
            ("seq_lens", torch.int32, (seqs,)),
            ("block_tables", torch.int32, (self.max_blocks, groups, _padded_seqs(seqs))),
        ]

    def _tables_offset(self, tokens: int, seqs: int) -> int:
        offset = self._tables_offsets.get((tokens, seqs))
        if offset is None:
            fields = self._fields(tokens, seqs)[:-1]
            offset = sum(_aligned(_nbytes(dtype, shape)) for _, dtype, shape in fields)
            self._tables_offsets[(tokens, seqs)] = offset
        return offset

    def _tables_bytes(self, columns: int, seqs: int) -> int:
        return 4 * columns * self.num_groups * _padded_seqs(seqs)

    def views(self, tokens: int, seqs: int) -> Views:
        """(host numpy arrays, device tensors) of a step of `tokens` tokens and `seqs` sequences,
        by input name; block_tables as [G, S, max_blocks] (block-major underneath)."""
        layout = (tokens, seqs)
        if layout not in self._views:
            host = self._carve(self.host_bytes, tokens, seqs)
            self._views[layout] = (
                {name: tensor.numpy() for name, tensor in host.items()},
                self._carve(self.dev_bytes, tokens, seqs),
            )
        return self._views[layout]

    def _carve(self, buffer: torch.Tensor, tokens: int, seqs: int) -> dict[str, torch.Tensor]:
        views, offset = {}, 0
        for name, dtype, shape in self._fields(tokens, seqs):
            size = _nbytes(dtype, shape)
            views[name] = buffer[offset : offset + size].view(dtype).view(shape)
            offset += _aligned(size)
        views["slot_mapping"] = views["slot_mapping"][:, :tokens]
        views["block_tables"] = views["block_tables"].permute(1, 2, 0)[:, :seqs]
        return views

    def upload(self, tokens: int, seqs: int, width: int) -> bool:
        """Copies the step's inputs, its block tables' first `width` columns, in one copy that
        does not wait for the stream on the GPU; returns False, copying nothing, where the device
        holds them already (track_device)."""
        end = self._tables_offset(tokens, seqs) + self._tables_bytes(width, seqs)
        host = self.host_bytes.numpy()
        if self._holds((tokens, seqs), end) and np.array_equal(host[:end], self.on_device[:end]):
            self.num_skipped += 1
            return False
        self.dev_bytes[:end].copy_(self.host_bytes[:end], non_blocking=True)
        if self.on_device is not None:
            self.on_device[:end] = host[:end]
            self._device_holds = ((tokens, seqs), end)
        return True

    def _holds(self, layout: Layout, end: int) -> bool:
        held = self._device_holds
        return held is not None and held[0] == layout and held[1] >= end

    def forget(self) -> None:
        """The device's inputs are not known any more (something other than `upload` wrote them)."""
        self._device_holds = None

    def ids_unknown(self, tokens: int, seqs: int, rows: int) -> None:
        """The device's first `rows` input ids were written on the device (a fed copy)."""
        if self._holds((tokens, seqs), 0):
            self._device_views(tokens, seqs)["input_ids"][:rows] = UNKNOWN

    def advanced(self, tokens: int, seqs: int, block_size: int) -> None:
        """The device ran a graph that advanced the inputs of this one-token-a-sequence layout:
        the same DecodeAdvance on what the host knows it holds. Its tables are cut to the columns
        the host sent, so a row whose next block was never sent gets slot -1, which the host
        never writes for a real token: the next step uploads."""
        if not self._holds((tokens, seqs), 0):
            return
        held = self._device_views(tokens, seqs)
        known = (self._device_holds[1] - self._tables_offset(tokens, seqs)) // self._tables_bytes(
            1, seqs
        )
        DecodeAdvance(held["positions"], held["seq_lens"], held["slot_mapping"],
                      held["block_tables"][:, :, :known], block_size).apply()  # fmt: skip

    def _device_views(self, tokens: int, seqs: int) -> dict[str, torch.Tensor]:
        # (carved once a layout: carving them anew was half the advance's host time, 51.6 -> 27.5
        # us on a 2-core CPU: benchmarks/upload_cost.py)
        layout = (tokens, seqs)
        if layout not in self._held_views:
            self._held_views[layout] = self._carve(torch.from_numpy(self.on_device), tokens, seqs)
        return self._held_views[layout]


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _padded_seqs(seqs: int) -> int:
    """Sequences per block-table column: a multiple of 16, so that the block stride (this times
    the groups) is too, whatever the step's size."""
    return -(-seqs // 16) * 16
