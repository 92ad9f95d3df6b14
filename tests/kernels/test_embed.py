"""The embedding kernel (gossamer/kernels/embed.py) against TorchOps.embed and plain indexing."""

from __future__ import annotations

import torch

from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, kernel_fixture

embed = kernel_fixture("embed")


def test_rows_of_the_ids_and_of_the_fed_ones(embed):
    """Negative ids take the fed id at their position; hidden 100 is not a power of two."""
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(50, 100, generator=g).to(DEVICE)
    ids = torch.tensor([3, -1, 49, -1, 0], device=DEVICE)
    fed = torch.tensor([9, 7, 9, 12, 9, 9], device=DEVICE)  # longer than ids: the graph's buffer
    expected = weight[torch.tensor([3, 7, 49, 12, 0], device=DEVICE)]
    assert torch.equal(embed.embed(ids, weight, fed), expected)
    assert torch.equal(TorchOps().embed(ids, weight, fed), expected)
    plain = ids.clamp(min=0)
    assert torch.equal(embed.embed(plain, weight), weight[plain])
    assert embed.embed(ids[:0], weight, fed).shape == (0, 100)
