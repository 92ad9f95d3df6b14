"""StepBuffers: a step's inputs as views of one buffer, laid out per step size.

What the layout promises: every view (every group's row too) starts 16-byte aligned and the
block tables' block stride is a multiple of 16 entries in every layout, since Triton specializes
kernels on pointer alignment and divisibility: a step size with other alignments would compile
new kernel variants mid-run. And a step's inputs are a prefix of the buffer."""

from __future__ import annotations

import pytest
import torch

from gossamer.runner.step_buffers import ALIGN, StepBuffers

SIZES = [(1, 1), (3, 3), (7, 2), (8, 8), (13, 5), (64, 64), (100, 33)]


@pytest.fixture(scope="module")
def buffers() -> StepBuffers:
    return StepBuffers(
        max_tokens=128, max_seqs=64, num_groups=2, max_blocks=40, device=torch.device("cpu")
    )


@pytest.mark.parametrize(("tokens", "seqs"), SIZES)
def test_every_view_is_aligned_and_the_block_stride_divisible(buffers, tokens, seqs):
    _, dev = buffers.views(tokens, seqs)
    rows = [
        dev[name] for name in ("input_ids", "positions", "tree_mask", "query_start_loc", "seq_lens")
    ]
    rows += [dev["slot_mapping"][g] for g in range(2)] + [dev["block_tables"][g] for g in range(2)]
    assert all(row.data_ptr() % ALIGN == 0 for row in rows)
    tables = dev["block_tables"]
    assert tables.shape == (2, seqs, 40) and tables.stride(1) == 1 and tables.stride(2) % 16 == 0
    assert dev["slot_mapping"].shape == (2, tokens) and dev["input_ids"].shape == (tokens,)


@pytest.mark.parametrize(("tokens", "seqs"), SIZES)
def test_the_first_columns_of_every_table_lie_in_the_uploaded_prefix(buffers, tokens, seqs):
    """Writes through the host views land in the bytes one upload of `width` columns copies;
    columns past it do not."""
    host, dev = buffers.views(tokens, seqs)
    buffers.host_bytes.zero_()
    width = 3
    host["input_ids"][:] = 7
    host["slot_mapping"][:] = 5
    host["seq_lens"][:] = 9
    host["block_tables"][:, :, :width] = 11
    host["block_tables"][:, :, width:] = 13
    buffers.dev_bytes.zero_()
    buffers.upload(tokens, seqs, width)
    assert (dev["input_ids"] == 7).all() and (dev["slot_mapping"] == 5).all()
    assert (dev["seq_lens"] == 9).all()
    assert (dev["block_tables"][:, :, :width] == 11).all()
    assert (dev["block_tables"][:, :, width:] == 0).all()


def test_views_of_a_size_are_made_once(buffers):
    assert buffers.views(8, 8)[1]["input_ids"] is buffers.views(8, 8)[1]["input_ids"]
