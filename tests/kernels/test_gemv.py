"""Small-M linear (gossamer/kernels/gemv.py) against torch.nn.functional.linear.

CPU tests run the kernels in the Triton interpreter on tiny fp32/fp16 problems, with tiles small
enough that both kernels (tensor-core "dot" and M == 1 "fma"), both split-K fix-ups, ragged row
edges and K tails that are not a multiple of the tile are all exercised. GPU tests (`-m gpu`) run
the decode projections of gpt-oss-120b in bf16, and a CUDA-graph replay of the split fix-up.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from gossamer.kernels.gemv import WHOLE_K, GemvConfig, plan_gemv
from gossamer.ops.base import DecodeAdvance
from tests.kernels.interpreted import DEVICE, kernel_fixture

gemv = kernel_fixture("gemv")

# tiles for tiny problems: 16 rows x 16 or 32 columns, so K = 200 has a ragged tail
TINY = {
    "dot": GemvConfig(kernel="dot", block_n=16, block_k=32, num_warps=1),
    "dot_reduce": GemvConfig(kernel="dot", block_n=16, block_k=32, fixup="reduce", num_warps=1),
    "dot_no_split": GemvConfig(kernel="dot", block_n=16, block_k=16, split_k=1, num_warps=1),
    "dot_early": GemvConfig(kernel="dot", block_n=16, block_k=32, num_warps=1, early=True),
    "fma": GemvConfig(kernel="fma", block_n=8, block_k=32, num_warps=1),
    "fma_reduce": GemvConfig(kernel="fma", block_n=8, block_k=32, fixup="reduce", num_warps=1),
    "fma_no_split": GemvConfig(kernel="fma", block_n=8, block_k=16, split_k=1, num_warps=1),
}


def _problem(m: int, n: int, k: int, dtype: torch.dtype, seed: int, device: str = DEVICE):
    g = torch.Generator(device).manual_seed(seed)  # on the device: the unembedding is 579M values
    x = torch.randn(m, k, generator=g, device=device).to(dtype)
    weight = (torch.randn(n, k, generator=g, device=device) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=g, device=device).to(dtype)
    return x, weight, bias


def _exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 truth of the same (already rounded) inputs."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("config", TINY.keys())
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", [(70, 200), (16, 256)])
def test_float32_matches_exact(gemv, config, m, n, k):
    x, weight, bias = _problem(m, n, k, torch.float32, seed=m * n + k)
    out = gemv.gemv(x, weight, bias, TINY[config])
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _exact(x, weight, bias), atol=2e-5, rtol=2e-5)


WIDE = {  # tiles for wide batches (here 17..64 rows: BLOCK_M 32 or 64) beside 32-row W blocks
    "wide_split": GemvConfig(kernel="dot", block_n=32, block_k=32, num_warps=2),
    "wide_reduce": GemvConfig(kernel="dot", block_n=32, block_k=32, num_warps=2, fixup="reduce"),
    "wide_no_split": GemvConfig(kernel="dot", block_n=32, block_k=32, num_warps=2, split_k=1),
}


@pytest.mark.parametrize("config", WIDE.keys())
@pytest.mark.parametrize("m", [17, 32, 64])
def test_wide_batches_match_exact(gemv, config, m):
    """Batches past 16 rows (a decode step of up to 64 sequences): ragged rows of W (70) and of
    x (17), K with a tail (200), split or not; float32 exact, float16 rounded once."""
    x, weight, bias = _problem(m, 70, 200, torch.float32, seed=m)
    out = gemv.gemv(x, weight, bias, WIDE[config])
    assert out.shape == (m, 70)
    torch.testing.assert_close(out.double(), _exact(x, weight, bias), atol=2e-5, rtol=2e-5)
    half = [t.to(torch.float16) for t in (x, weight, bias)]
    out = gemv.gemv(*half, WIDE[config])
    torch.testing.assert_close(out, _exact(*half).to(torch.float16), atol=2e-3, rtol=1e-3)


def test_wide_batches_take_the_wide_tiles():
    """From WIDE_FROM rows each shape class takes its "_wide" config, whose x tile covers all the
    rows (BLOCK_M = next power of two): the router of gpt-oss-120b on 32-row blocks split over K
    with a reduce launch, O on 32-row blocks (2 warps), not the one-warp 16-row blocks of batches
    up to 8; and `linear` serves the router to 64 rows and O to 32."""
    from gossamer.kernels import gemv as gemv_module

    for n, k, name in [(5120, 2880, "tall"), (2880, 4096, "medium"), (128, 2880, "narrow")]:
        small = plan_gemv(gemv_module.WIDE_FROM - 1, n, k, 132)
        assert small.config == gemv_module.CONFIGS[name] and small.block_m == 8
        for m, block_m in [(gemv_module.WIDE_FROM, 16), (17, 32), (33, 64), (64, 64)]:
            plan = plan_gemv(m, n, k, 132)
            assert plan.config == gemv_module.CONFIGS[f"{name}_wide"] and plan.block_m == block_m
            assert (plan.split_k - 1) * plan.k_per_split < k <= plan.split_k * plan.k_per_split
    router = plan_gemv(64, 128, 2880, 132)
    assert router.config.fixup == "reduce" and router.split_k > 1 and router.config.block_n == 32
    weight = {name: torch.empty(n, k, dtype=torch.bfloat16, device="meta")
              for name, n, k in [("router", 128, 2880), ("o", 2880, 4096), ("qkv", 5120, 2880)]}  # fmt: skip
    served = {
        name: max(m for m in range(1, 80)
                  if gemv_module.serves(torch.empty(m, w.shape[1], dtype=w.dtype, device="meta"), w))
        for name, w in weight.items()
    }  # fmt: skip
    assert served == {"router": 64, "o": 32, "qkv": gemv_module.GEMV_MAX_M}


def test_launch_keys_part_the_row_counts_as_triton_compiles_them(monkeypatch):
    from gossamer.kernels import gemv as gemv_module

    monkeypatch.setattr(gemv_module, "GEMV_MAX_M", 64)
    firsts: dict[tuple, int] = {}
    for m in range(1, 65):
        firsts.setdefault(gemv_module.launch_key(m), m)
    # M == 1; BLOCK_M 2, 4, 8; the wide config from 9 rows: BLOCK_M 16 (and 16 rows, a multiple
    # of 16), 32 (and 32) and 64 (and 48, 64)
    assert sorted(firsts.values()) == [1, 2, 3, 5, 9, 16, 17, 32, 33, 48]
    assert gemv_module.launch_key(65) == () and gemv_module.launch_key(0) == ()
    # by default: (narrow, medium, tall, huge) served at 1 row, then QKV (tall) to cuBLAS past
    # GEMV_MAX_M and O (medium) past 32 rows; the router (narrow) to 64
    monkeypatch.setattr(gemv_module, "GEMV_MAX_M", 8)
    served = [gemv_module.launch_key(m)[0] for m in (1, 8, 9, 32, 33, 64)]
    assert served == [(True, True, True, True), (True, True, True, False),
                      (True, True, False, False), (True, True, False, False),
                      (True, False, False, False), (True, False, False, False)]  # fmt: skip
    assert gemv_module.launch_key(65) == ()


def test_tiny_configs_cover_split_and_tail():
    """The parametrization above means what it says: these plans split K, others do not."""
    for name, config in TINY.items():
        plan = plan_gemv(1, 70, 200, 4, config)
        assert (plan.split_k > 1) == ("no_split" not in name), name
        assert plan.config.kernel == config.kernel
        assert 200 % config.block_k != 0  # a ragged K tail everywhere
    assert plan_gemv(3, 70, 200, 4, TINY["fma"]).config.kernel == "dot"  # fma serves M == 1 only


@pytest.mark.parametrize("config", ["dot", "fma", "dot_no_split"])
@pytest.mark.parametrize("m", [1, 5])
def test_float16_rounds_once_from_a_float32_sum(gemv, config, m):
    x, weight, bias = _problem(m, 40, 1000, torch.float16, seed=11)
    out = gemv.gemv(x, weight, bias, TINY[config])
    assert out.dtype == torch.float16
    expected = _exact(x, weight, bias).to(torch.float16)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("config", ["dot", "fma_no_split", "dot_reduce"])
@pytest.mark.parametrize("m", [1, 4])
def test_without_bias(gemv, config, m):
    x, weight, _ = _problem(m, 33, 300, torch.float32, seed=5)
    out = gemv.gemv(x, weight, None, TINY[config])
    torch.testing.assert_close(out.double(), _exact(x, weight, None), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kernel", ["dot", "fma"])
def test_fixups_add_splits_in_the_same_order(gemv, kernel):
    """The last-arriving program and the reduce kernel both add the partials in split order and
    then the bias, so their results are bitwise equal; the counters are back at zero after."""
    x, weight, bias = _problem(1, 70, 1000, torch.float32, seed=9)
    last = gemv.gemv(x, weight, bias, TINY[kernel])
    reduced = gemv.gemv(x, weight, bias, TINY[f"{kernel}_reduce"])
    assert torch.equal(last, reduced)
    assert not gemv._counters(x.device).any()
    assert torch.equal(gemv.gemv(x, weight, bias, TINY[kernel]), last)  # a second launch agrees


@pytest.mark.parametrize("config", ["dot", "dot_reduce", "dot_no_split", "fma", "fma_reduce"])
@pytest.mark.parametrize("m", [1, 3])
def test_float32_logits_hold_the_rounded_values(gemv, config, m):
    """out_dtype=float32 (`logits`): the values the x-dtype output holds, widened: bit-equal to
    gemv(...).float() through every finish (unsplit, last-program fixup, reduce kernel)."""
    x, weight, bias = _problem(m, 40, 1000, torch.float16, seed=12)
    half = gemv.gemv(x, weight, bias, TINY[config])
    wide = gemv.gemv(x, weight, bias, TINY[config], out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, half.float())
    with pytest.raises(ValueError, match="writes"):
        gemv.gemv(x, weight, bias, TINY[config], out_dtype=torch.bfloat16)


def test_logits_take_the_triton_gemv_where_it_serves(gemv, monkeypatch):
    x, weight, _ = _problem(1, 70, 200, torch.float16, seed=13)
    out = gemv.logits(x, weight)
    assert out.dtype == torch.float32 and torch.equal(out, gemv.gemv(x, weight, None).float())
    many = torch.randn(gemv.max_rows("narrow") + 1, 200, device=DEVICE).to(torch.float16)
    assert torch.equal(gemv.logits(many, weight), F.linear(many, weight).float())  # torch's
    # the unembedding's shape ("huge"): Triton at one token only with TRITON_UNEMBED on
    x1 = torch.empty(1, 2880, dtype=torch.bfloat16, device="meta")
    unembed = torch.empty(201088, 2880, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(gemv, "TRITON_UNEMBED", False)
    assert not gemv.serves(x1, unembed)
    monkeypatch.setattr(gemv, "TRITON_UNEMBED", True)
    assert gemv.serves(x1, unembed) and not gemv.serves(x1.expand(2, -1), unembed)
    plan = gemv.plan_gemv(1, 201088, 2880, 132)  # (the fixture's module: its own GemvConfig)
    assert plan.config == gemv.CONFIGS["huge_m1"] and plan.split_k == 1


@pytest.mark.parametrize("m", [1, 3])
def test_greedy_pick_is_torch_argmax(gemv, m):
    """The unsplit dot kernel's greedy pick (one atomic max a program, the last one to arrive
    reads the winners): torch.argmax of the logits it stores, ties to the first index (rows 5
    and 40 equal and largest for token 0; token 1 all zeros), across a ragged last row block,
    twice in a row (the scratch resets itself)."""
    for seed in (14, 15):
        x, weight, _ = _problem(m, 70, 200, torch.float16, seed=seed)
        weight[5] = weight[40] = (x[0] * 4 / x[0].norm()).to(torch.float16)
        if m > 1:
            x[1] = 0.0
        greedy = torch.full((m,), -1, dtype=torch.int64, device=DEVICE)
        out, picked = gemv._gemv(x, weight, None, TINY["dot_no_split"], torch.float32, greedy, None)
        assert picked and torch.equal(greedy, out.argmax(dim=-1))
        assert greedy[0] == 5 and (m == 1 or greedy[1] == 0)
    keys, arrivals = gemv._GREEDY_KEYS[greedy.device]  # (cuda:0 on the GPU, not cuda)
    assert (keys == -(2**63)).all() and arrivals.item() == 0


def test_logits_pick_greedily_on_every_path(gemv):
    """`logits(..., greedy_out)`: torch.argmax of the logits whether the GEMV picks (unsplit) or
    not (a K split: an argmax after it; too many rows: torch's linear)."""
    x, weight, _ = _problem(1, 70, 200, torch.float16, seed=16)
    unused = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    assert not gemv._gemv(x, weight, None, TINY["dot"], torch.float32, unused, None)[1]  # split: no
    for rows in (1, 3, gemv.GEMV_MAX_M + 1, gemv.max_rows("narrow") + 1):
        x = torch.randn(rows, 200, device=DEVICE).to(torch.float16)
        greedy = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
        out = gemv.logits(x, weight, greedy)
        assert torch.equal(greedy, out.argmax(dim=-1))
        assert torch.equal(out, gemv.logits(x, weight))


def _decode_inputs(rows: int, groups: int = 2, columns: int = 4, block_size: int = 4):
    """A plain-decode step's inputs (ops.base.DecodeAdvance) as the runner lays them out: tables
    block-major ([columns, G, S] underneath), slots [G, S] of a wider buffer; row 1 a padding row
    (slot -1) when there are more than 2, the last row at the last position of its table."""
    positions = torch.tensor([5, 0, 2, 3, 9, 15][:rows], dtype=torch.int64, device=DEVICE)
    positions[-1] = columns * block_size - 1
    tables = torch.arange(columns * groups * 16, dtype=torch.int32, device=DEVICE) + 3
    tables = tables.view(columns, groups, 16).permute(1, 2, 0)[:, :rows]
    slots = torch.zeros(groups, rows + 2, dtype=torch.int64, device=DEVICE)[:, :rows]
    for g in range(groups):
        slots[g] = tables[g, torch.arange(rows), positions // block_size] * block_size
        slots[g] += positions % block_size
    if rows > 2:
        slots[:, 1] = -1
    seq_lens = (positions + 1).to(torch.int32)
    return DecodeAdvance(positions, seq_lens, slots, tables, block_size)


def _snapshot(advance) -> list[torch.Tensor]:
    return [t.clone() for t in (advance.positions, advance.seq_lens, advance.slot_mapping)]


def test_decode_advance_moves_each_real_row_one_token_on():
    """DecodeAdvance.apply (the reference the kernel is held to), against the rule written out:
    a real row's next position, one more key, and its block-table slot in each group; padding
    rows (slot -1) untouched; a row whose next position is past its table's columns gets -1."""
    advance = _decode_inputs(3)
    before = _snapshot(advance)
    advance.apply()
    tables, size = advance.block_tables, advance.block_size
    for row in range(3):
        position = int(before[0][row])
        if row == 1:  # padding
            assert advance.positions[row] == position and advance.seq_lens[row] == before[1][row]
            assert (advance.slot_mapping[:, row] == -1).all()
            continue
        assert advance.positions[row] == position + 1
        assert advance.seq_lens[row] == before[1][row] + 1
        for g in range(2):
            column = (position + 1) // size
            expected = (
                -1 if column >= 4 else int(tables[g, row, column]) * size + (position + 1) % size
            )
            assert advance.slot_mapping[g, row] == expected
    assert advance.slot_mapping[0, 2] == -1  # row 2 sat at the last position of its table


@pytest.mark.parametrize("m", [1, 3])
def test_greedy_pick_advances_the_step_inputs(gemv, m, monkeypatch):
    """With `advance`, the program that writes the picks (unsplit dot kernel) also moves the
    step's inputs on, as DecodeAdvance.apply does; a split plan leaves them to `logits`, which
    then applies it in torch ops, as it does where the GEMV does not serve (torch's linear)."""
    x, weight, _ = _problem(m, 70, 200, torch.float16, seed=17)
    expected = _decode_inputs(m)
    expected.apply()
    greedy = torch.full((m,), -1, dtype=torch.int64, device=DEVICE)
    advance = _decode_inputs(m)
    out, picked = gemv._gemv(x, weight, None, TINY["dot_no_split"], torch.float32, greedy, advance)
    assert picked and torch.equal(greedy, out.argmax(dim=-1))
    assert all(map(torch.equal, _snapshot(advance), _snapshot(expected)))
    untouched = _decode_inputs(m)
    assert not gemv._gemv(x, weight, None, TINY["dot"], torch.float32, greedy, untouched)[1]
    assert all(map(torch.equal, _snapshot(untouched), _snapshot(_decode_inputs(m))))
    monkeypatch.setattr(gemv, "serves", lambda *args: False)
    advance = _decode_inputs(m)
    gemv.logits(x, weight, greedy, advance)
    assert all(map(torch.equal, _snapshot(advance), _snapshot(expected)))


def test_pack_tiles_puts_each_tile_in_one_run(gemv):
    weight = torch.randn(37, 100)
    tiles = gemv.pack_tiles(weight, 16, 32)
    assert tiles.shape == (3, 4, 16, 32) and tiles.is_contiguous()
    assert torch.equal(tiles[1, 2], weight[16:32, 64:96])
    assert torch.equal(tiles[2, 3, :5, :4], weight[32:, 96:]) and not tiles[2, 3, 5:].any()
    assert torch.equal(tiles.transpose(1, 2).reshape(48, 128)[:37, :100], weight)


@pytest.fixture
def packed_on(gemv, monkeypatch):
    monkeypatch.setattr(gemv, "USE_PACKED", True)
    yield gemv
    gemv.clear_packed()


@pytest.mark.parametrize("config", ["dot", "dot_reduce", "dot_no_split", "dot_early"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_plans_read_the_packed_copy_with_their_tile(packed_on, config, m):
    """A registered packed copy gives the same bits (the same tiles in the same order; the padding
    is zeros where the row-major path masks); it is what the kernel reads (a copy of another weight
    registered in its place gives that weight's outputs); other tiles and USE_PACKED off ignore it."""
    gemv = packed_on
    x, weight, bias = _problem(m, 70, 200, torch.float32, seed=m + 40)
    other = torch.randn_like(weight)
    plain = gemv.gemv(x, weight, bias, TINY[config])
    tile = (TINY[config].block_n, TINY[config].block_k)
    gemv.register_packed(weight, *tile)
    assert torch.equal(gemv.gemv(x, weight, bias, TINY[config]), plain)
    key = (weight.data_ptr(), *tile)
    gemv._PACKED[key] = gemv.PackedWeight(gemv.pack_tiles(other, *tile), gemv._PACKED[key].source)
    assert torch.equal(gemv.gemv(x, weight, bias, TINY[config]),
                       gemv.gemv(x, other, bias, TINY[config]))  # fmt: skip
    wider = replace(TINY[config], block_k=2 * tile[1])  # another tile: W itself is read...
    wide_plain = gemv.gemv(x, weight.clone(), bias, wider)
    assert torch.equal(gemv.gemv(x, weight, bias, wider), wide_plain)
    gemv.register_packed(weight, tile[0], 2 * tile[1])  # ...until that tile has its own copy
    assert torch.equal(gemv.gemv(x, weight, bias, wider), wide_plain)
    assert len(gemv._PACKED) == 2
    fma = gemv.gemv(x[:1], weight, bias, TINY["fma"])
    torch.testing.assert_close(fma, plain[:1], atol=2e-5, rtol=2e-5)
    gemv.USE_PACKED = False
    assert torch.equal(gemv.gemv(x, weight, bias, TINY[config]), plain)


@pytest.mark.parametrize("n,k", [(70, 200), (5, 256), (3, 1000)])
def test_whole_k_tiles(gemv, n, k):
    """WHOLE_K: one tile of the next power of two >= K (masked past K), never split."""
    config = GemvConfig(kernel="fma", block_n=1, block_k=WHOLE_K, num_warps=1)
    plan = plan_gemv(1, n, k, 4, config)
    assert plan.split_k == 1 and plan.config.block_k >= k > plan.config.block_k // 2
    x, weight, bias = _problem(1, n, k, torch.float32, seed=n + k)
    out = gemv.gemv(x, weight, bias, config)
    torch.testing.assert_close(out.double(), _exact(x, weight, bias), atol=2e-5, rtol=2e-5)


def test_default_configs_and_plans_cover_every_column():
    # the interpreter plans for 4 SMs: 24 rows -> 1 row block, so K=1000 is split at M > 1; at
    # M == 1 the router-sized GEMV reads whole rows
    assert plan_gemv(2, 24, 1000, 4).split_k > 1
    assert plan_gemv(1, 24, 1000, 4).split_k == 1
    cases = [(1, 24, 1000, 4), (1, 5120, 2880, 132), (1, 128, 2880, 132), (8, 2880, 4096, 132),
             (1, 201088, 2880, 132), (16, 32, 2880, 132), (3, 5120, 2880, 132)]  # fmt: skip
    for m, n, k, sms in cases:
        plan = plan_gemv(m, n, k, sms)
        assert plan.k_per_split % plan.config.block_k == 0
        assert (plan.split_k - 1) * plan.k_per_split < k <= plan.split_k * plan.k_per_split
        assert plan.block_m >= m and plan.row_blocks * plan.config.block_n >= n
    # 132 SMs: O is split into several programs per SM (QKV too above one token), the router over
    # most SMs, and the unembedding (thousands of row blocks) not at all
    for m, n, k, programs in [
        (1, 2880, 4096, 4 * 132),
        (2, 5120, 2880, 4 * 132),
        (1, 128, 2880, 100),
    ]:
        plan = plan_gemv(m, n, k, 132)
        assert plan.row_blocks * plan.split_k >= programs
    assert plan_gemv(1, 201088, 2880, 132).split_k == 1
    # QKV at one token: unsplit (CONFIGS["tall_m1"]), 320 row blocks of 16 rows
    qkv = plan_gemv(1, 5120, 2880, 132)
    assert (qkv.split_k, qkv.row_blocks, qkv.config.num_stages) == (1, 320, 12)


def test_strided_input_rows_and_leading_dims(gemv):
    wide = torch.randn(3, 2, 100, device=DEVICE)
    x = wide[:, 0, :]  # row stride 200
    _, weight, bias = _problem(1, 20, 100, torch.float32, seed=2)
    torch.testing.assert_close(
        gemv.gemv(x, weight, bias, TINY["dot"]).double(), _exact(x, weight, bias), atol=2e-5,
        rtol=2e-5,
    )  # fmt: skip
    batched = torch.randn(2, 3, 100, device=DEVICE)  # [..., K] keeps its leading dims
    out = gemv.gemv(batched, weight, bias, TINY["dot"])
    assert out.shape == (2, 3, 20)
    torch.testing.assert_close(out.double(), _exact(batched, weight, bias), atol=2e-5, rtol=2e-5)
    assert gemv.gemv(batched[:0], weight, bias).shape == (0, 3, 20)


def test_linear_hands_large_batches_to_torch(gemv, monkeypatch):
    x, weight, bias = _problem(gemv.max_rows("narrow") + 1, 16, 64, torch.float32, seed=4)
    assert torch.equal(gemv.linear(x, weight, bias), F.linear(x, weight, bias))
    with pytest.raises(ValueError, match="at most"):
        gemv.gemv(torch.randn(gemv.MAX_ROWS + 1, 64, device=DEVICE), weight, bias)
    with pytest.raises(ValueError, match="unknown"):
        GemvConfig(fixup="atomic")
    monkeypatch.setattr(gemv, "GEMV_MAX_M", 8)  # switched on: small batches go to Triton
    calls = []
    monkeypatch.setattr(gemv, "gemv", lambda *args: calls.append(args) or F.linear(*args))
    gemv.linear(x[:8], weight, bias)
    assert len(calls) == 1
    monkeypatch.setattr(gemv, "shape_class", lambda n, k: "huge")  # the unembedding: cuBLAS
    gemv.linear(x[:8], weight, bias)
    assert len(calls) == 1


# (name, out_features, in_features): the dense projections of one gpt-oss-120b decode step
GPT_OSS_SHAPES = [
    ("qkv", 5120, 2880),
    ("o_proj", 2880, 4096),
    ("router_120b", 128, 2880),
    ("router_20b", 32, 2880),
    ("unembedding", 201088, 2880),
]
GPU_CONFIGS = {
    "dot_reduce": GemvConfig(fixup="reduce"),
    "fma": GemvConfig(kernel="fma", block_n=16, block_k=256, num_warps=4),
    "dot_ragged_k": GemvConfig(block_n=32, block_k=128, num_stages=3),  # 2880 % 128 != 0
    # every W tile of a program sent to L2 before the PDL wait (more prefetches than tiles)
    "dot_prefetch_all": GemvConfig(block_n=16, num_warps=1, programs_per_sm=8, prefetch=16),
    "dot_early": GemvConfig(block_n=16, num_warps=1, programs_per_sm=8, early=True),
}


def _check_bf16(out, x, weight, bias):
    exact = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    # float32 accumulation in either order, then one bf16 rounding: within a bf16 ulp or two
    torch.testing.assert_close(out.float(), exact, atol=2e-2, rtol=1e-2)
    cublas = F.linear(x, weight, bias).float()
    assert (out.float() - exact).abs().mean() <= 1.2 * (cublas - exact).abs().mean() + 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 17, 48, 64])  # from 9 (WIDE_FROM): "_wide" tiles
@pytest.mark.parametrize("name,n,k", GPT_OSS_SHAPES)
def test_gpu_gpt_oss_projections_bf16(name, n, k, m):
    from gossamer.kernels import gemv as compiled

    x, weight, bias = _problem(m, n, k, torch.bfloat16, seed=n + m, device="cuda")
    bias = None if name == "unembedding" else bias
    _check_bf16(compiled.gemv(x, weight, bias), x, weight, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("name,n,k", GPT_OSS_SHAPES[:2])
def test_gpu_packed_qkv_and_o_give_the_same_bits(name, n, k, m, wide, monkeypatch):
    """QKV and O read from their tile-packed copies (gemv.USE_PACKED) in their default plans, or
    on a wide tile (64 x 128, 4 warps): the same tiles in the same order, so the same bits as the
    row-major weight."""
    from gossamer.kernels import gemv as compiled

    x, weight, bias = _problem(m, n, k, torch.bfloat16, seed=n + m + 1, device="cuda")
    config = compiled.default_config(m, n, k)
    if wide:
        config = GemvConfig(block_n=64, block_k=128, num_warps=4, programs_per_sm=4)
    plain = compiled.gemv(x, weight, bias, config)
    monkeypatch.setattr(compiled, "USE_PACKED", True)
    compiled.register_packed(weight, config.block_n, config.block_k)
    try:
        assert torch.equal(compiled.gemv(x, weight, bias, config), plain)
    finally:
        compiled.clear_packed()


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS.keys())
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("name,n,k", GPT_OSS_SHAPES[:3])
def test_gpu_other_configs_bf16(name, n, k, m, config):
    from gossamer.kernels import gemv as compiled

    x, weight, bias = _problem(m, n, k, torch.bfloat16, seed=n + m, device="cuda")
    _check_bf16(compiled.gemv(x, weight, bias, GPU_CONFIGS[config]), x, weight, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["huge_m1", "huge", "fma"])
def test_gpu_unembedding_logits_on_the_triton_gemv(config):
    """The batch-1 unembedding (gemv.TRITON_UNEMBED's path) on its tile and others: float32 logits
    that hold bf16 values, within the bf16 GEMV tolerance of the exact product, and the same bits as
    the bf16 output widened."""
    from gossamer.kernels import gemv as compiled

    x, weight, _ = _problem(1, 201088, 2880, torch.bfloat16, seed=21, device="cuda")
    tile = compiled.CONFIGS.get(config) or GPU_CONFIGS[config]
    logits = compiled.gemv(x, weight, None, tile, out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, compiled.gemv(x, weight, None, tile).float())
    _check_bf16(logits.to(torch.bfloat16), x, weight, None)


@pytest.mark.gpu
def test_gpu_greedy_pick_of_the_unembedding_replays_in_a_cuda_graph():
    """The batch-1 unembedding's greedy pick (201,088 rows over ~6,300 programs) is
    torch.argmax of its logits, eagerly and in graph replays with new inputs each time."""
    from gossamer.kernels import gemv as compiled

    x, weight, _ = _problem(1, 201088, 2880, torch.bfloat16, seed=22, device="cuda")
    weight[7] = weight[150000] = weight[7] * 4  # a tie for the largest logit of some inputs
    greedy = torch.full((1,), -1, dtype=torch.int64, device="cuda")
    logits, picked = compiled._gemv(x, weight, None, None, torch.float32, greedy, None)
    assert picked and torch.equal(greedy, logits.argmax(dim=-1))  # the kernel's pick, no argmax
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled.logits(x, weight, greedy)
    for seed in range(4):
        x.copy_(torch.randn(x.shape, generator=torch.Generator("cuda").manual_seed(seed),
                            device="cuda"))  # fmt: skip
        if seed == 0:
            x.copy_(weight[7])  # rows 7 and 150000 tie: the first wins
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(greedy, out.argmax(dim=-1))
        assert seed != 0 or greedy.item() == 7


@pytest.mark.gpu
def test_gpu_unembedding_advances_the_inputs_in_graph_replays():
    """The batch-1 unembedding with `advance`: its last program moves the inputs on at every
    replay as DecodeAdvance.apply does (no torch ops in the graph: the GEMV picks)."""
    from gossamer.kernels import gemv as compiled

    x, weight, _ = _problem(1, 201088, 2880, torch.bfloat16, seed=23, device="cuda")
    greedy = torch.full((1,), -1, dtype=torch.int64, device="cuda")
    advance = _decode_inputs(1, columns=64, block_size=16)
    advance.positions.fill_(30)  # position 30: block column 1, offset 14
    advance.seq_lens.fill_(31)
    advance.slot_mapping.copy_(advance.block_tables[:, :, 1] * 16 + 14)
    expected = replace(advance, **{name: getattr(advance, name).clone() for name in
                                   ("positions", "seq_lens", "slot_mapping")})  # fmt: skip
    assert compiled._gemv(x, weight, None, None, torch.float32, greedy, None)[1]  # the GEMV picks
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compiled.logits(x, weight, greedy, advance)
    expected.apply()  # (the capture ran nothing)
    for _ in range(5):  # positions 30 -> 35: across a block boundary
        graph.replay()
        torch.cuda.synchronize()
        assert all(map(torch.equal, _snapshot(advance), _snapshot(expected)))
        expected.apply()


@pytest.mark.gpu
@pytest.mark.parametrize("fixup", ["last", "reduce"])
def test_gpu_split_fixup_replays_in_a_cuda_graph(fixup):
    """Counters must return to zero inside the graph: replays give the same bits as eager calls."""
    from gossamer.kernels import gemv as compiled

    config = GemvConfig(fixup=fixup)
    weights = [_problem(4, 128, 2880, torch.bfloat16, seed=s, device="cuda") for s in range(3)]
    eager = [compiled.gemv(x, w, b, config) for x, w, b in weights]  # also warms the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [compiled.gemv(x, w, b, config) for x, w, b in weights]
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for out, expected in zip(outs, eager, strict=True):
            assert torch.equal(out, expected)
    assert plan_gemv(4, 128, 2880, compiled._num_sms(torch.device("cuda")), config).split_k > 1
    assert not compiled._counters(torch.device("cuda", torch.cuda.current_device())).any()
