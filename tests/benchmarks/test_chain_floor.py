"""benchmarks/chain_floor.py: the step's kernels and their bytes, and the streaming kernel's sums."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gossamer.presets import preset
from gossamer.testing import REPO_ROOT
from tests.benchmarks.conftest import BENCHMARKS


@pytest.fixture
def chain(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports timing; the test imports decode_speed
    yield benchmark_script("chain_floor")
    sys.modules.pop("timing", None)
    sys.modules.pop("decode_speed", None)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
@pytest.mark.parametrize("context", [1, 1024, 8192])
def test_segments_read_the_bytes_of_a_batch_1_step(chain, name, context):
    import decode_speed

    cfg = preset(name)
    big = chain.step_segments(cfg, context, small=False)
    assert sum(s.nbytes for s in big) == pytest.approx(decode_speed.step_bytes(cfg, 1, context))
    every = chain.step_segments(cfg, context)
    # per layer: two norms and the routing (small), QKV, attention, O, router, gate_up, down;
    # then the final norm, the unembedding and the sampling
    assert len(every) == 9 * cfg.num_hidden_layers + 3
    assert len(every) - len(big) == 3 * cfg.num_hidden_layers + 2


@pytest.mark.parametrize("nbytes", [4, 60, 16 << 10, (16 << 10) + 4, 10_000_004])
def test_launch_plans_cover_every_word_once(chain, nbytes):
    grid = chain.Grid(programs_per_sm=8, block=1024)
    programs, per_program = chain.launch_plan(nbytes, grid, num_sms=132)
    words = -(-nbytes // 4)
    assert per_program % grid.block == 0
    assert (programs - 1) * per_program < words <= programs * per_program
    assert programs == 1 if nbytes <= chain.SMALL_BYTES else programs <= 8 * 132


STREAM_CHECK = """
import torch
import chain_floor as chain
grid = chain.Grid(programs_per_sm=2, block=64, num_warps=1)
programs, per_program = chain.launch_plan(chain.SMALL_BYTES + 4, grid, 3)
src = torch.randint(-1000, 1000, (programs * per_program - 17,), dtype=torch.int32)
out = torch.zeros(programs, dtype=torch.int32)
chain.stream(src, out, grid, num_sms=3)
expected = [int(run.sum()) for run in src.split(per_program)]
assert programs > 1 and out.tolist() == expected, (out.tolist(), expected)
src = torch.randint(-1000, 1000, (37, 100), dtype=torch.int32)  # 3 row blocks, a ragged split
out = torch.zeros(64, dtype=torch.int32)
row_blocks, splits, per_split = chain.tiled_plan(37, 100, 1)
chain.stream_tiled(src, out, num_sms=1)
expected = [int(src[n * 16:(n + 1) * 16, k * per_split:(k + 1) * per_split].sum())
            for n in range(row_blocks) for k in range(splits)]
assert splits > 1 and out[: row_blocks * splits].tolist() == expected
padded = torch.zeros(row_blocks * 16, splits * per_split, dtype=torch.int32)
padded[:37, :100] = src  # the repack: tile t of program (n, k) is one run of 16 x 32 words
tiles = padded.view(row_blocks, 16, splits, per_split // 32, 32).permute(0, 2, 3, 1, 4)
packed = tiles.contiguous().flatten()
out.zero_()
chain.stream_tiled(packed.as_strided(src.shape, src.stride()), out, 1, packed=True)
assert out[: row_blocks * splits].tolist() == expected
experts = torch.randint(-1000, 1000, (4 * 40, 70), dtype=torch.int32)  # 4 experts of 40 rows
out.zero_()
chain.stream_experts_tiled(experts, out, "gate_up", 4)  # 32-row blocks, one program each
expected = [int(block.sum()) for block in experts.split(32)]
assert out[: len(expected)].tolist() == expected
out.zero_()
chain.stream_experts_tiled(experts, out, "down", 4)  # program r: row r of each expert
expected = [int(experts[r::40].sum()) for r in range(40)]
assert out[:40].tolist() == expected
for name, programs, rows in (("gate_up", 5, 32), ("down", 40, 4)):  # repacked by program
    size = chain.packed_expert_words(name, 160, 70, 4)
    assert size == programs * 2 * rows * 64  # two steps of 64 words
    tiles = torch.randint(-1000, 1000, (programs, 2, rows, 64), dtype=torch.int32)
    tiles[:, 1, :, 70 - 64:] = 0  # past the rows' end: never read
    out.zero_()
    whole = tiles.flatten()
    chain.stream_experts_tiled(whole.as_strided(experts.shape, experts.stride()), out, name, 4,
                               packed=True)
    assert out[:programs].tolist() == tiles.sum(dim=(1, 2, 3)).tolist()
print("ok", programs)
"""


def test_stream_kernel_sums_each_programs_run():
    """The streaming kernel, interpreted in a fresh process (Triton picks interpreter or compiler
    at its first import; this test process may have made that choice already)."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(BENCHMARKS)]))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", STREAM_CHECK], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok ")


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_tiled_reads_qkv_and_o_as_the_gemv_plans_them(chain, name):
    from gossamer.kernels import gemv

    shaped = [s for s in chain.step_segments(preset(name), 1024) if s.shape is not None]
    assert {s.name for s in shaped} == {"qkv", "o"}
    for segment in shaped[:2]:
        rows, cols = segment.shape
        assert segment.nbytes == 2 * rows * cols
        plan = gemv.plan_gemv(1, rows, cols, 132)
        assert (
            plan.config.block_n == chain.TILE_ROWS and plan.config.block_k == 2 * chain.TILE_WORDS
        )
        assert chain.tiled_plan(rows, cols // 2, 132) == (
            plan.row_blocks,
            plan.split_k,
            plan.k_per_split // 2,
        )


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_expert_segments_name_the_top_k_experts_words(chain, name):
    cfg = preset(name)
    experts = [s for s in chain.step_segments(cfg, 1024) if s.expert_words is not None]
    assert [s.name for s in experts[:2]] == ["gate_up", "down"]
    assert len(experts) == 2 * cfg.num_hidden_layers
    for segment in experts[:2]:
        top_k, rows, words = segment.expert_words
        assert top_k == cfg.num_experts_per_tok
        # the packed words are 16/17 of the bytes (one e8m0 scale byte per 16 word bytes)
        assert 4 * top_k * rows * words == pytest.approx(segment.nbytes * 16 / 17, rel=1e-6)
