"""The decode attention kernel with the rotary embedding and the KV write in its prologue
(`rope_write_kv_attention`, gossamer/kernels/attention.py) against the two launches it replaces:
rope.py's `rope_and_write_kv`, then `attention` on the rotated q.

CPU tests run both under the Triton interpreter, which computes float32 like numpy (no fused
multiply-adds), so the output and the cache must match to the bit. The new token's slot starts as
NaN: a program that reads it before it is written returns NaN. Slots no query may read (the null
block 0, the tails of last blocks) hold NaN too (tests/kernels/test_attention.py `make_batch`).
GPU tests (`-m gpu`) run the compiled kernels at gpt-oss-120b shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

import gossamer.ops.triton as triton_ops
from gossamer.ops.base import AttentionMetadata
from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import load_interpreted
from tests.kernels.test_attention import Batch, LaunchSpy, make_batch, with_trees

_ATTENTION = load_interpreted("attention")
_ROPE = load_interpreted("rope")
PADDING = (1, 1)  # a CUDA-graph padding row: seq_len 1, the null block, slot -1, position 0


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    """The interpreted attention and rope modules, with TRITON_INTERPRET=1 while tests launch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield _ATTENTION, _ROPE


@dataclass
class Step:
    """One decode step: un-rotated q, k, v of the new tokens over a batch's cache."""

    batch: Batch
    k: torch.Tensor  # [T, Hkv, D] (a strided view of one QKV row, as the model passes it)
    v: torch.Tensor  # [T, Hkv, D]
    positions: torch.Tensor  # [T]
    cos_sin: torch.Tensor  # [max_pos, D] float32
    slot_mapping: torch.Tensor  # [T] int64


def make_step(seqs: list[tuple[int, int]], padding: tuple[int, ...] = (), **options) -> Step:
    """A decode step over make_batch(seqs); sequences at `padding` become graph padding rows."""
    batch = make_batch(seqs, **options)
    meta = batch.metadata
    block_table = meta.block_tables[batch.group]
    num_tokens, num_q_heads, head_dim = batch.q.shape
    num_kv_heads, block_size = batch.kv_cache.shape[3], batch.kv_cache.shape[2]
    device, dtype = batch.q.device, batch.q.dtype
    gen = torch.Generator(device=device).manual_seed(7)
    widths = [num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    qkv = torch.randn(num_tokens, sum(widths), generator=gen, device=device).to(dtype)
    q, k, v = (part.view(num_tokens, -1, head_dim) for part in qkv.split(widths, dim=-1))
    batch.q = q
    last = meta.seq_lens.long() - 1  # the new token's position
    slots = block_table.long().gather(1, (last // block_size)[:, None])[:, 0] * block_size
    slots += last % block_size
    batch.kv_cache.view(2, -1, num_kv_heads, head_dim)[:, slots] = float("nan")  # not yet written
    for seq in padding:
        assert seqs[seq] == PADDING
        block_table[seq] = 0
        slots[seq] = -1
    angles = torch.rand(max(meta.seq_lens_host) + 3, head_dim // 2, generator=gen, device=device)
    cos_sin = torch.cat((1.3 * (6.3 * angles).cos(), 1.3 * (6.3 * angles).sin()), dim=-1)
    return Step(batch, k, v, last, cos_sin, slots)


def run_fused(attention: ModuleType, step: Step, **launch: int) -> tuple[torch.Tensor, ...]:
    """The fused launch -> (output, cache after it)."""
    cache = step.batch.kv_cache.clone()
    out = _paged(attention, step, step.batch.q, cache, launch, new_kv=attention.NewKV(
        step.k, step.v, step.positions, step.cos_sin, step.slot_mapping))  # fmt: skip
    return out, cache


def run_composed(kernels: tuple[ModuleType, ModuleType], step: Step, **launch: int):
    """rope.py's rope_and_write_kv then the attention launch -> (output, cache after them)."""
    attention, rope = kernels
    cache = step.batch.kv_cache.clone()
    q = rope.rope_and_write_kv(
        step.batch.q, step.k, step.v, step.positions, step.cos_sin, cache, step.slot_mapping
    )
    return _paged(attention, step, q, cache, launch), cache


def _paged(attention, step: Step, q, cache, launch, new_kv=None) -> torch.Tensor:
    batch, meta = step.batch, step.batch.metadata
    return attention.paged_attention(
        q, cache, meta.query_start_loc, meta.seq_lens, meta.block_tables[batch.group],
        meta.max_query_len, meta.max_seq_len, batch.sinks, batch.scale, batch.sliding_window,
        new_kv=new_kv, **launch,
    )  # fmt: skip


def torch_ops(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """TorchOps.rope_write_kv_attention -> (output, cache after it): the oracle."""
    batch = step.batch
    cache = batch.kv_cache.clone()
    out = TorchOps().rope_write_kv_attention(
        batch.q, step.k, step.v, step.positions, step.cos_sin, cache, step.slot_mapping,
        batch.metadata, batch.group, batch.sinks, batch.scale, batch.sliding_window,
    )  # fmt: skip
    return out, cache


def assert_same(fused: tuple[torch.Tensor, ...], composed: tuple[torch.Tensor, ...]) -> None:
    """Outputs and caches bit for bit (padding rows read the NaN null block on both sides)."""
    for actual, expected in zip(fused, composed, strict=True):
        torch.testing.assert_close(actual, expected, atol=0, rtol=0, equal_nan=True)


def real_rows(step: Step, padding: tuple[int, ...] = ()) -> list[int]:
    return [token for token in range(step.batch.q.shape[0]) if token not in padding]


def assert_matches_oracle(fused, step: Step, padding: tuple[int, ...] = ()) -> None:
    out, cache = fused
    expected_out, expected_cache = torch_ops(step)
    tol = dict(atol=2e-5, rtol=1e-4) if out.dtype == torch.float32 else dict(atol=3e-3, rtol=3e-3)
    rows = real_rows(step, padding)
    assert not out[rows].isnan().any()
    torch.testing.assert_close(out[rows], expected_out[rows], **tol)
    torch.testing.assert_close(cache, expected_cache, equal_nan=True, **tol)


DECODES = {
    "context_1": ([(1, 1)], {}),
    "context_not_block_multiple": ([(1, 37)], {}),
    "mixed_lengths": ([(1, 1), (1, 5), (1, 37), (1, 64), (1, 17)], {}),
    "gqa4": ([(1, 21), (1, 3)], dict(num_q_heads=8, num_kv_heads=2)),
    "gqa3": ([(1, 21), (1, 3)], dict(num_q_heads=6, num_kv_heads=2)),
    "gqa1": ([(1, 21), (1, 3)], dict(num_q_heads=2, num_kv_heads=2)),
    "block_16": ([(1, 16), (1, 33), (1, 50)], dict(block_size=16)),
}
# Launch knobs: the heuristics, and 3 splits of 16-key iterations (several partials, some empty,
# the new key in the last non-empty split), and more splits than iterations.
LAUNCHES = {"heuristic": {}, "three_splits": dict(num_splits=3, block_n=16),
            "eight_splits": dict(num_splits=8, block_n=16)}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("launch", LAUNCHES.values(), ids=LAUNCHES.keys())
@pytest.mark.parametrize("case", DECODES.values(), ids=DECODES.keys())
def test_fused_decode_matches_rope_then_attention(kernels, case, launch, dtype) -> None:
    seqs, options = case
    step = make_step(seqs, dtype=dtype, **options)
    fused = run_fused(kernels[0], step, **launch)
    assert_same(fused, run_composed(kernels, step, **launch))
    assert_matches_oracle(fused, step)


@pytest.mark.parametrize("sliding_window", [None, 8])
def test_first_tile_loaded_early_or_late_gives_the_same_bits(kernels, monkeypatch, sliding_window):
    """EARLY_KV loads each split's first key tile before the new key is stored (and patches the
    new key's row in registers; the slot holds NaN until it is written): the same output and
    cache as loading it after the store, with the new key in a first tile and in a later one."""
    attention = kernels[0]
    step = make_step([(1, 5), (1, 40), (1, 16), (1, 17)], sliding_window=sliding_window)
    for launch in ({}, dict(num_splits=2, block_n=16), dict(num_splits=1, block_n=16)):
        monkeypatch.setattr(attention, "EARLY_KV", True)
        early = run_fused(attention, step, **launch)
        monkeypatch.setattr(attention, "EARLY_KV", False)
        assert_same(early, run_fused(attention, step, **launch))
        assert_matches_oracle(early, step)
        # the later tiles loaded an iteration ahead too (PREFETCH_NEXT_KV): the same bits
        monkeypatch.setattr(attention, "EARLY_KV", True)
        monkeypatch.setattr(attention, "PREFETCH_NEXT_KV", True)
        assert_same(early, run_fused(attention, step, **launch))
        monkeypatch.setattr(attention, "PREFETCH_NEXT_KV", False)


@pytest.mark.parametrize("gemv_max_m", [8, 2])
def test_first_tile_early_only_where_qkv_is_a_triton_gemv(kernels, monkeypatch, gemv_max_m):
    """The early tile overlaps the QKV projection's tail only where that projection is a Triton
    GEMV launch (PDL); past the rows the GEMV serves, cuBLAS projects and the launch loads it
    after the wait. The rule follows gemv's limit (gpt-oss's QKV weight: [5120, 2880])."""
    attention = kernels[0]
    gemv = attention.gemv  # the copy the interpreted module imports
    monkeypatch.setattr(gemv, "GEMV_MAX_M", gemv_max_m)
    qkv_weight = torch.empty(5120, 2880, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(attention, "EARLY_KV", True)
    for tokens in (1, 2, 3, 8, 9, 64):
        x = torch.empty(tokens, 2880, dtype=torch.bfloat16, device="meta")
        assert attention._early_kv(tokens) == gemv.serves(x, qkv_weight)
    assert attention._early_kv(gemv_max_m) and not attention._early_kv(gemv_max_m + 1)
    monkeypatch.setattr(attention, "EARLY_KV", False)
    assert not attention._early_kv(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize("window", [8, 40])
def test_sliding_window_edges(kernels, window: int, num_splits: int, dtype) -> None:
    """Exactly the window, window + 1, shorter and far longer contexts (null blocks before the
    window): the splits start at the window, and only the one with the new key writes it."""
    seqs = [(1, window), (1, window + 1), (1, 3), (1, window + 62)]
    step = make_step(seqs, sliding_window=window, dtype=dtype)
    launch = dict(num_splits=num_splits, block_n=16)
    fused = run_fused(kernels[0], step, **launch)
    assert_same(fused, run_composed(kernels, step, **launch))
    assert_matches_oracle(fused, step)


@pytest.mark.parametrize("sliding_window", [None, 8])
@pytest.mark.parametrize("launch", LAUNCHES.values(), ids=LAUNCHES.keys())
def test_padding_rows_store_nothing(kernels, launch, sliding_window) -> None:
    """Graph padding rows (slot -1, the null block) between real ones: nothing stored for them,
    the real rows exact; the padding rows read the null block, as the two launches do."""
    padding = (1, 3)
    seqs = [(1, 21), PADDING, (1, 40), PADDING]
    step = make_step(seqs, padding=padding, sliding_window=sliding_window)
    fused = run_fused(kernels[0], step, **launch)
    assert_same(fused, run_composed(kernels, step, **launch))
    assert_matches_oracle(fused, step, padding)
    untouched = step.batch.kv_cache[:, 0].isnan().all()  # nothing written to the null block
    assert untouched and fused[1][:, 0].isnan().all()


def test_strided_qkv_and_int32_positions(kernels) -> None:
    step = make_step([(1, 30), (1, 9)], dtype=torch.float16)
    assert not step.k.is_contiguous()  # views into the QKV rows
    step.positions = step.positions.to(torch.int32)
    assert_same(run_fused(kernels[0], step), run_composed(kernels, step))


def test_rejects_multi_token_and_tree_batches(kernels) -> None:
    attention = kernels[0]
    step = make_step([(1, 9), (1, 4)])
    new_kv = attention.NewKV(step.k, step.v, step.positions, step.cos_sin, step.slot_mapping)
    meta = step.batch.metadata
    meta.max_query_len = 2
    with pytest.raises(ValueError, match="one query token"):
        _paged(attention, step, step.batch.q, step.batch.kv_cache, {}, new_kv=new_kv)
    assert not attention.fuses_rope_write_kv(step.batch.q, meta)
    meta.max_query_len = 1
    assert attention.fuses_rope_write_kv(step.batch.q, meta)
    meta.tree_mask = torch.zeros(2, dtype=torch.int64)
    assert not attention.fuses_rope_write_kv(step.batch.q, meta)


# ---------------------------------------------------------------- the op through TritonOps


@pytest.fixture
def backend(kernels, monkeypatch: pytest.MonkeyPatch) -> tuple[triton_ops.TritonOps, LaunchSpy]:
    """TritonOps on the interpreted kernels, and a counter of rope.py's launches."""
    attention, rope = kernels
    monkeypatch.setattr(triton_ops, "rope", rope)
    monkeypatch.setattr(triton_ops, "_kernel_module", {"attention": attention}.get)
    rope_launches = LaunchSpy(rope._rope_kv_kernel)
    monkeypatch.setattr(rope, "_rope_kv_kernel", rope_launches)
    return triton_ops.TritonOps(), rope_launches


def through_ops(ops, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    batch = step.batch
    cache = batch.kv_cache.clone()
    out = ops.rope_write_kv_attention(
        batch.q, step.k, step.v, step.positions, step.cos_sin, cache, step.slot_mapping,
        batch.metadata, batch.group, batch.sinks, batch.scale, batch.sliding_window,
    )  # fmt: skip
    return out, cache


@pytest.mark.parametrize("sliding_window", [None, 6])
def test_triton_ops_fuses_pure_decode(kernels, backend, sliding_window) -> None:
    ops, rope_launches = backend
    step = make_step([(1, 9), PADDING, (1, 30)], padding=(1,), sliding_window=sliding_window)
    fused = through_ops(ops, step)
    assert rope_launches.launches == 0
    assert_same(fused, run_composed(kernels, step))


def _multi_token_step(seqs: list[tuple[int, int]], sliding_window: int | None) -> Step:
    """A step whose tokens are every sequence's last query_len positions, at their slots."""
    batch = make_batch(seqs, sliding_window=sliding_window)
    step = make_step([(1, seq_len) for _, seq_len in seqs], sliding_window=sliding_window)
    meta: AttentionMetadata = batch.metadata
    block_table = meta.block_tables[batch.group]
    positions = torch.cat([torch.arange(s - q, s) for q, s in seqs])
    sequence = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor([q for q, _ in seqs]))
    block_size, head_dim = batch.kv_cache.shape[2], batch.q.shape[2]
    slots = block_table.long()[sequence, positions // block_size] * block_size
    num_tokens, num_kv_heads = batch.q.shape[0], batch.kv_cache.shape[3]
    kv = torch.randn(2, num_tokens, num_kv_heads, head_dim)
    return Step(batch, kv[0], kv[1], positions, step.cos_sin, slots + positions % block_size)


@pytest.mark.parametrize("sliding_window", [None, 6])
@pytest.mark.parametrize("kind", ["verify", "mixed", "tree"])
def test_triton_ops_composes_other_batches(kernels, backend, kind, sliding_window) -> None:
    """Speculative verification, chunked prefill beside decodes, and a tree step: the two launches."""
    ops, rope_launches = backend
    seqs = {"verify": [(3, 20), (1, 9)], "mixed": [(12, 29), (1, 9)], "tree": [(3, 20), (1, 9)]}
    step = _multi_token_step(seqs[kind], sliding_window)
    if kind == "tree":
        with_trees(step.batch, {0: (-1, 0)})
    out, cache = through_ops(ops, step)
    assert rope_launches.launches == 1
    expected_out, expected_cache = torch_ops(step)
    torch.testing.assert_close(out, expected_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(cache, expected_cache, atol=1e-6, rtol=1e-6, equal_nan=True)


# ---------------------------------------------------------------- GPU: gpt-oss-120b shapes

GPU_SHAPES = dict(num_q_heads=64, num_kv_heads=8, head_dim=64, block_size=16, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "window_128"])
@pytest.mark.parametrize(
    "seqs, padding",
    [
        ([(1, 1024)], ()),
        ([(1, 8192)], ()),
        ([(1, 8192), (1, 1), (1, 128), (1, 129), (1, 1000), PADDING, PADDING], (5, 6)),
    ],
    ids=["b1_1k", "b1_8k", "b7_mixed_padded"],
)
def test_gpu_fused_decode(seqs, padding, sliding_window) -> None:
    from gossamer.kernels import attention, rope

    step = make_step(seqs, padding, sliding_window=sliding_window, device="cuda", **GPU_SHAPES)
    fused = run_fused(attention, step)
    composed = run_composed((attention, rope), step)
    rows = real_rows(step, padding)
    # The same float32 arithmetic, but the compiler may contract a different multiply-add.
    for actual, expected in ((fused[0][rows], composed[0][rows]), (fused[1], composed[1])):
        torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-2, equal_nan=True)
    exact = torch.equal(fused[1].nan_to_num(), composed[1].nan_to_num())
    print(f"cache bit-identical to the two launches: {exact}")
    out, _ = torch_ops(step)
    torch.testing.assert_close(fused[0][rows].float(), out[rows].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "window_128"])
def test_gpu_fused_decode_into_fp8_cache(sliding_window) -> None:
    """The fused launch writes the rotated key rounded to bf16 and then to e4m3, as rope then
    write_kv do, and reads the fp8 cache widened to bf16. (Not on the CPU: the interpreter rounds
    some fp8 conversions wrongly, see test_attention.test_write_kv_into_fp8_cache.)"""
    from gossamer.kernels import attention, rope

    seqs, padding = [(1, 8192), (1, 1), (1, 129), (1, 1000), PADDING], (4,)
    step = make_step(seqs, padding, sliding_window=sliding_window, device="cuda",
                     kv_dtype=torch.float8_e4m3fn, **GPU_SHAPES)  # fmt: skip
    fused = run_fused(attention, step)
    composed = run_composed((attention, rope), step)
    expected_out, expected_cache = torch_ops(step)
    rows = real_rows(step, padding)
    # a multiply-add contracted differently may move a key by one e4m3 step (12.5% at most)
    for cache in (fused[1], composed[1]):
        torch.testing.assert_close(cache.float(), expected_cache.float(), atol=1e-2, rtol=0.13,
                                   equal_nan=True)  # fmt: skip
    exact = torch.equal(fused[1].view(torch.uint8), expected_cache.view(torch.uint8))
    print(f"fp8 cache bit-identical to the torch ops: {exact}")
    for out in (fused[0], composed[0]):
        torch.testing.assert_close(out[rows].float(), expected_out[rows].float(), atol=2e-2,
                                   rtol=2e-2)  # fmt: skip
