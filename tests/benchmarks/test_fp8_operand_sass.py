"""benchmarks/fp8_operand_sass.py's recipes (the SASS compile itself needs Triton's CUDA tools and
runs by hand)."""

from __future__ import annotations

import torch


def test_the_e5m2_registers_decode_every_code_of_every_element(benchmark_script):
    benchmark_script("fp8_operand_sass").check_e5m2_registers()  # raises on any wrong byte


def test_a_wrong_mask_is_caught(benchmark_script):
    study = benchmark_script("fp8_operand_sass")
    saved = study.B_ROTATED_26
    study.B_ROTATED_26 = 0x00800000  # drops element 3's sign
    try:
        study.check_e5m2_registers()
    except AssertionError as error:
        assert "element 3" in str(error)
    else:
        raise AssertionError("the check passed with a wrong mask")
    finally:
        study.B_ROTATED_26 = saved


def test_two_e4m3_terms_hold_bf16_activations(benchmark_script):
    """hi + lo is exact where the scaled value is at least 2^-2, within 2^-10 below."""
    x = (torch.randn(4, 4096) * torch.logspace(-6, 3, 4096)).to(torch.bfloat16)
    x[1] *= 1e-20  # a tiny row: the power-of-two scale brings it up
    hi, lo, scale = benchmark_script("fp8_operand_sass").split_e4m3(x)
    scaled = x.float() * scale
    assert (scaled.abs().amax(dim=-1) > 224).all() and (scaled.abs().amax(dim=-1) <= 448).all()
    total = hi.float() + lo.float()
    large = scaled.abs() >= 0.25
    assert torch.equal(total[large], scaled[large])
    assert (total[~large] - scaled[~large]).abs().max() <= 2.0**-10
    assert (~large).any() and large.any()
