"""Sending later kernels' weights to L2 (gossamer/kernels/pdl.py prefetch_bulk, gemv.py's
`prefetch=`): the requests of all programs cover each region exactly once and stay in bounds, and
a GEMV that sends them gives the same bits as one that does not (CPU: the interpreter's twin of the
PTX request; GPU: the real `cp.async.bulk.prefetch.L2`)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels.interpreted import DEVICE, ON_GPU, kernel_fixture, kernel_module

gemv = kernel_fixture("gemv")


_pdl = None  # the kernel module the test kernel below calls (set by the test: interpreted or not)


def _requests_kernel():
    """Decorated per test, after TRITON_INTERPRET is set (Triton picks the interpreter then)."""

    @triton.jit
    def requests(offsets_ptr, sizes_ptr, nbytes, parts, LANES: tl.constexpr, STEPS: tl.constexpr):
        """Writes every request program `part` would send: [parts, STEPS, LANES] offsets and
        sizes, -1 for inactive lanes and steps past its share."""
        part = tl.program_id(0)
        first, end = _pdl.bulk_share(nbytes, part, parts)
        for i in tl.static_range(STEPS):
            step = first + i * LANES
            offset, size, active = _pdl.bulk_requests(nbytes, step, end, LANES)
            where = (part * STEPS + i) * LANES + tl.arange(0, LANES)
            tl.store(offsets_ptr + where, tl.where(active, offset, -1))
            tl.store(sizes_ptr + where, tl.where(active, size, -1))

    return requests


@pytest.mark.parametrize("nbytes", [16, 4096, 4112, 5 * 4096, 123 * 4096 + 48])
@pytest.mark.parametrize("parts,lanes", [(1, 4), (3, 2), (7, 8), (40, 1)])
def test_requests_cover_each_byte_once(monkeypatch, nbytes, parts, lanes):
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    pdl = kernel_module("pdl")
    monkeypatch.setitem(globals(), "_pdl", pdl)
    chunk = pdl.BULK_CHUNK.value
    share = triton.cdiv(triton.cdiv(nbytes, chunk), parts)
    steps = triton.cdiv(share, lanes)
    offsets = torch.empty(parts * steps * lanes, dtype=torch.int64, device=DEVICE)
    sizes = torch.empty(parts * steps * lanes, dtype=torch.int32, device=DEVICE)
    _requests_kernel()[(parts,)](offsets, sizes, nbytes, parts, LANES=lanes, STEPS=steps)
    sent = [(o, s) for o, s in zip(offsets.tolist(), sizes.tolist(), strict=True) if o >= 0]
    covered = torch.zeros(nbytes, dtype=torch.int32)
    for offset, size in sent:
        assert size > 0 and size % 16 == 0 and size <= chunk and offset % 16 == 0
        assert offset + size <= nbytes
        covered[offset : offset + size] += 1
    assert torch.equal(covered, torch.ones(nbytes, dtype=torch.int32))


@pytest.mark.parametrize("config,m", [("dot", 1), ("dot", 3), ("fma", 1)])  # FMA: M == 1 only
def test_gemv_with_prefetch_gives_the_same_bits(gemv, monkeypatch, config, m):
    g = torch.Generator(DEVICE).manual_seed(m)
    x = torch.randn(m, 96, generator=g, device=DEVICE)
    weight = torch.randn(40, 96, generator=g, device=DEVICE)
    bias = torch.randn(40, generator=g, device=DEVICE)
    later = (torch.randn(33, 70, device=DEVICE), torch.randn(5000, device=DEVICE))
    cfg = gemv.GemvConfig(kernel=config, block_n=8, block_k=32, num_warps=1)
    monkeypatch.setattr(gemv, "L2_PREFETCH", False)
    plain = gemv.gemv(x, weight, bias, cfg, prefetch=later)
    monkeypatch.setattr(gemv, "L2_PREFETCH", True)
    assert len(gemv._prefetch_regions(later)) == 2
    sent = gemv.gemv(x, weight, bias, cfg, prefetch=later)
    assert torch.equal(plain, sent)
    torch.testing.assert_close(sent, torch.nn.functional.linear(x, weight, bias))


def test_prefetch_regions_skip_what_cannot_be_sent(gemv, monkeypatch):
    monkeypatch.setattr(gemv, "L2_PREFETCH", True)
    strided = torch.zeros(8, 8)[:, ::2]
    tiny = torch.zeros(3, dtype=torch.float32)  # 12 bytes: less than one 16-byte unit
    kept = torch.zeros(64)
    assert gemv._prefetch_regions((strided, tiny, kept, kept, kept)) == (kept, kept)
    args = gemv._prefetch_args((kept,), tiny)
    assert args[1] == 256 and args[2] is tiny and args[3] == 0
    monkeypatch.setattr(gemv, "L2_PREFETCH", False)
    assert gemv._prefetch_regions((kept,)) == ()


@pytest.mark.gpu
def test_gpu_model_step_is_unchanged_by_prefetch(monkeypatch):
    """A bf16 QKV-shaped GEMV that sends the O projection's weight gives the same bits."""
    from gossamer.kernels import gemv as compiled

    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(1, 2880, generator=g, device="cuda").bfloat16()
    qkv = torch.randn(5120, 2880, generator=g, device="cuda").bfloat16()
    o_proj = torch.randn(2880, 4096, generator=g, device="cuda").bfloat16()
    router = torch.randn(128, 2880, generator=g, device="cuda").bfloat16()
    monkeypatch.setattr(compiled, "L2_PREFETCH", False)
    plain = compiled.gemv(x, qkv, None, prefetch=(o_proj, router))
    monkeypatch.setattr(compiled, "L2_PREFETCH", True)
    sent = compiled.gemv(x, qkv, None, prefetch=(o_proj, router))
    torch.cuda.synchronize()
    assert torch.equal(plain, sent)
