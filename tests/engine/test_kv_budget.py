"""The default KV cache budget on CUDA (engine.core.kv_cache_bytes), with the CUDA memory queries
faked: what torch's caching allocator holds unused counts as free."""

import logging

import pytest
import torch

from gossamer.engine import core

GiB = core.GiB


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(free, total, reserved, allocated):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)

    return install


def test_cached_allocator_memory_counts_as_free(fake_cuda, caplog):
    # an 80 GiB card: 61 GiB of weights allocated, 5 GiB more held by the allocator unused
    fake_cuda(free=13 * GiB, total=80 * GiB, reserved=66 * GiB, allocated=61 * GiB)
    with caplog.at_level(logging.INFO, logger="gossamer.engine.core"):
        budget = core.kv_cache_bytes(torch.device("cuda", 0), utilization=0.9)
    assert budget == pytest.approx((13 + 5 - 8 - 4) * GiB)
    assert "5.00 cached by torch" in caplog.text


def test_no_room_left_is_a_clear_error(fake_cuda):
    fake_cuda(free=9 * GiB, total=80 * GiB, reserved=61 * GiB, allocated=61 * GiB)
    with pytest.raises(RuntimeError, match="no GPU memory is left for the KV cache"):
        core.kv_cache_bytes(torch.device("cuda", 0), utilization=0.9)


def test_cpu_budget_is_one_gib():
    assert core.kv_cache_bytes(torch.device("cpu"), utilization=0.9) == GiB
