"""TritonOps (gossamer/ops/triton.py) drives a whole model like TorchOps does.

Without a GPU the backend's kernel modules are swapped for interpreted copies, so this runs the
dispatch code and every Triton kernel of a forward pass (norm, GEMV, fused rope + KV write,
attention, MoE) on the CPU, in float32, through the model's real calls: a prefill chunk then decode
steps. On a GPU it runs the compiled backend. The oracle is the same model on TorchOps.
"""

from __future__ import annotations

import pytest
import torch

import gossamer.ops.triton as triton_ops
from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model.loader import load_model
from tests.hf_models import write_hf_model
from tests.kernels.interpreted import DEVICE, ON_GPU, load_interpreted

KERNEL_MODULES = ("gemv", "norm", "rope", "attention", "moe_mxfp4")


@pytest.fixture
def interpreted_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    if ON_GPU:
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    modules = {name: load_interpreted(name) for name in KERNEL_MODULES}
    for name in ("gemv", "norm", "rope"):
        monkeypatch.setattr(triton_ops, name, modules[name])
    monkeypatch.setattr(triton_ops, "_kernel_module", modules.get)


def test_model_on_triton_ops_matches_torch_ops(tmp_path, interpreted_backend):
    path = write_hf_model(tmp_path / "ckpt", seed=3, num_hidden_layers=2, vocab_size=96)
    ours = load_model(str(path), dtype="float32", device=DEVICE, ops="triton").model
    reference = load_model(str(path), dtype="float32", device=DEVICE, ops="torch").model
    assert ours.ops.name == "triton" and reference.ops.name == "torch"
    tokens = [5, 17, 3, 88, 40, 2, 61, 9, 33, 70, 12]  # longer than the sliding window (8)

    def run(model) -> torch.Tensor:
        cache = ContiguousCache(model, len(tokens))
        logits = [forward_tokens(model, cache, tokens[:9], 0)]  # prefill: cuBLAS/torch linear
        for position in range(9, len(tokens)):  # decode: the M = 1 GEMV
            logits.append(forward_tokens(model, cache, [tokens[position]], position))
        return torch.cat(logits)

    ours_logits, reference_logits = run(ours), run(reference)
    error = float((ours_logits - reference_logits).norm() / reference_logits.norm())
    # float32 on both sides (on a GPU tl.dot may round its inputs to tf32)
    assert error < (3e-3 if ON_GPU else 1e-4)


def test_missing_kernel_module_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch):
    triton_ops._kernel_module.cache_clear()
    real_import = triton_ops.importlib.import_module

    def fake_import(name: str):
        if name == "gossamer.kernels.attention":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name)

    monkeypatch.setattr(triton_ops.importlib, "import_module", fake_import)
    try:
        with pytest.warns(UserWarning, match="attention.py is missing"):
            assert triton_ops._kernel("attention", "attention") is None
    finally:
        triton_ops._kernel_module.cache_clear()
