"""How the layers of a model map onto KV cache groups, and how many blocks fit in memory.

GPT-OSS alternates sliding-window layers (window 128) and full-attention layers. Both kinds keep
their keys and values in ONE pool of fixed-size blocks, split into cache groups:

- group 0: the full-attention layers; a request keeps every block of its sequence;
- group 1: the sliding-window layers; a request keeps only the blocks that the window of its next
  query can still see (older table entries become the null block).

A block id handed to group g stores the tokens of that block for every layer of group g, so the
physical cache is one tensor `[layers_per_group, 2, num_blocks, block_size, kv_heads, head_dim]` and
layer l reads and writes slot `layer_slots[l][1]` of it with the block table of group
`layer_slots[l][0]`. A group without layers is left out (a model with no sliding layers has a single
full group and wastes no blocks); `separate_sliding_group=False` puts every layer in one full group,
which is always correct and only costs memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "uint8": 1,
}


class _LayerTypes(Protocol):
    """The part of `gossamer.config.ModelConfig` that the layout reads."""

    num_hidden_layers: int
    sliding_window: int

    def is_sliding(self, layer: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One cache group: the layers that share a block table.

    `sliding_window` is None for full attention; otherwise a query at position p sees the keys at
    positions p - sliding_window + 1 .. p.
    """

    layer_ids: tuple[int, ...]
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")

    @property
    def is_sliding(self) -> bool:
        return self.sliding_window is not None


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """The cache groups of a model and where each layer's KV lives.

    `groups[i]` is group i (full first, then sliding; empty groups are left out).
    `layer_slots[l] == (group_index, slot)`: layer l uses that group's block table and index `slot`
    of the first dimension of the KV tensor.
    """

    groups: tuple[KVCacheGroupSpec, ...]
    layer_slots: tuple[tuple[int, int], ...]

    @property
    def layers_per_group(self) -> int:
        """First dimension of the KV tensor: the largest group decides it."""
        return max(len(group.layer_ids) for group in self.groups)

    @classmethod
    def from_layer_windows(
        cls, windows: list[int | None], *, separate_sliding_group: bool = True
    ) -> KVCacheLayout:
        """Layout for layers whose sliding window is `windows[l]` (None: full attention)."""
        if not windows:
            raise ValueError("a model needs at least one attention layer")
        sliding_sizes = {w for w in windows if w is not None}
        if len(sliding_sizes) > 1:
            raise ValueError(f"one sliding window size per model is supported, got {sliding_sizes}")
        if not separate_sliding_group:
            windows = [None] * len(windows)
        full = tuple(i for i, w in enumerate(windows) if w is None)
        sliding = tuple(i for i, w in enumerate(windows) if w is not None)
        groups: list[KVCacheGroupSpec] = []
        if full:
            groups.append(KVCacheGroupSpec(full))
        if sliding:
            groups.append(KVCacheGroupSpec(sliding, sliding_window=windows[sliding[0]]))
        slots: dict[int, tuple[int, int]] = {}
        for group_index, group in enumerate(groups):
            for slot, layer in enumerate(group.layer_ids):
                slots[layer] = (group_index, slot)
        return cls(tuple(groups), tuple(slots[layer] for layer in range(len(windows))))

    @classmethod
    def from_model_config(
        cls, model_config: _LayerTypes, *, separate_sliding_group: bool = True
    ) -> KVCacheLayout:
        """Layout of a `gossamer.config.ModelConfig` (its `layer_types` and `sliding_window`)."""
        windows = [
            model_config.sliding_window if model_config.is_sliding(layer) else None
            for layer in range(model_config.num_hidden_layers)
        ]
        return cls.from_layer_windows(windows, separate_sliding_group=separate_sliding_group)


def dtype_num_bytes(dtype: Any) -> int:
    """Bytes per element of a torch dtype, a dtype name ("bfloat16", "fp8", ...) or an int."""
    if isinstance(dtype, int):
        return dtype
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype and numpy dtypes
    if isinstance(itemsize, int):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def kv_block_bytes(
    *, layers_per_group: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: Any
) -> int:
    """Bytes one block id occupies in the KV tensor (keys and values of all layers of a group)."""
    return layers_per_group * 2 * block_size * num_kv_heads * head_dim * dtype_num_bytes(dtype)


def num_blocks_for_memory(
    memory_bytes: int,
    *,
    layers_per_group: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: Any = "bfloat16",
) -> int:
    """How many blocks (the null block 0 included) fit in `memory_bytes` of KV cache.

    Divide the KV heads by the tensor-parallel degree before calling when the cache is sharded.
    """
    per_block = kv_block_bytes(
        layers_per_group=layers_per_group,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    return max(0, math.floor(memory_bytes / per_block))
