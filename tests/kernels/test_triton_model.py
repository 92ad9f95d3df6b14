"""The whole model on the Triton backend (TritonOps) against the torch backend, on the GPU.

A small GPT-OSS written by transformers (random weights, then packed to MXFP4 by our writer so the
MoE kernel runs) is loaded three times on the GPU: bf16 with ops=triton, bf16 with ops=torch, and
float32 with ops=torch (the truth).

Stated bf16 tolerance: bf16 rounds activations at different places in the two backends (fused norms,
float32 GEMV accumulation, fused MoE), so neither is "the" bf16 answer. We require the Triton logits
to be within 5% relative error of the float32 truth and no worse than 1.5x the torch bf16 backend's
own error plus 0.5% (both are measured in the same run), and the two backends' greedy tokens to agree
for 64 steps; a divergence is accepted only at a near tie, i.e. where the float32 truth's logits of
the two chosen tokens differ by less than twice the larger of the two backends' errors there, and
with the logits up to it within the 5% (decode-path logits: the packed-fp16 MoE GEMV runs only in
decode steps).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens, generate_stream
from gossamer.model.loader import load_model
from gossamer.model.weights import save_checkpoint
from tests.hf_models import write_hf_model

pytestmark = pytest.mark.gpu

# gpt-oss-like proportions at a small size: head_dim 64, top-4 of 8 experts, hidden not a power of
# two (576 = 18 * 32, like 2880 = 90 * 32), a vocabulary that is not a multiple of the tiles.
SMALL = dict(
    num_hidden_layers=4,
    num_local_experts=8,
    num_experts_per_tok=4,
    hidden_size=576,
    intermediate_size=320,
    head_dim=64,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=1000,
    sliding_window=16,
)


def small_triton_model(root: Path, seed: int, max_model_len: int | None = None):
    """A SMALL random model saved as an MXFP4 checkpoint and loaded in bf16 on the Triton ops."""
    dense = load_model(str(write_hf_model(root / "hf", seed=seed, **SMALL)), dtype="float32").model
    packed = save_checkpoint(dense, root / "mxfp4")
    return load_model(str(packed), dtype="bfloat16", device="cuda", ops="triton",
                      max_model_len=max_model_len).model  # fmt: skip


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root: Path = tmp_path_factory.mktemp("triton_model")
    hf_dir = write_hf_model(root / "hf", seed=21, **SMALL)
    dense = load_model(str(hf_dir), dtype="float32").model
    packed = save_checkpoint(dense, root / "mxfp4")
    return {
        "triton": load_model(str(packed), dtype="bfloat16", device="cuda", ops="triton").model,
        "torch": load_model(str(packed), dtype="bfloat16", device="cuda", ops="torch").model,
        "truth": load_model(str(packed), dtype="float32", device="cuda", ops="torch").model,
    }


def _prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL["vocab_size"], (length,), generator=g).tolist()


def _prefill_then_decode(model, tokens: list[int], prompt_len: int) -> torch.Tensor:
    """Logits of a prompt chunk (prefill kernels) then one token at a time (decode kernels)."""
    cache = ContiguousCache(model, len(tokens))
    logits = [forward_tokens(model, cache, tokens[:prompt_len], 0)]
    for position in range(prompt_len, len(tokens)):
        logits.append(forward_tokens(model, cache, [tokens[position]], position))
    return torch.cat(logits).float()


def test_backend_reports_triton(models):
    from gossamer.ops.triton import TritonOps

    assert isinstance(models["triton"].ops, TritonOps)


def test_logits_match_within_the_stated_bf16_tolerance(models):
    tokens = _prompt(48, seed=1)  # 40-token prefill (longer than the window), then 8 decode steps
    ours = _prefill_then_decode(models["triton"], tokens, 40)
    torch_bf16 = _prefill_then_decode(models["torch"], tokens, 40)
    truth = _prefill_then_decode(models["truth"], tokens, 40)
    ours_error = relative_error(ours, truth)
    torch_error = relative_error(torch_bf16, truth)
    print(f"relative error vs fp32: triton {ours_error:.4f}, torch bf16 {torch_error:.4f}")
    assert torch.isfinite(ours).all()
    assert ours_error < 0.05
    assert ours_error <= 1.5 * torch_error + 0.005
    # the decode rows alone (M = 1 GEMVs, decode attention) meet the same bound
    assert relative_error(ours[40:], truth[40:]) < 0.05


def test_greedy_tokens_agree_for_64_steps(models):
    prompt = _prompt(24, seed=2)
    ours = list(generate_stream(models["triton"], prompt, 64))
    theirs = list(generate_stream(models["torch"], prompt, 64))
    if ours == theirs:
        return
    step = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
    # The logits of that step as generation computed them (prefill, then one token at a time),
    # from both bf16 backends and the float32 truth, on the same tokens.
    tokens = prompt + theirs[:step]
    sequences = {
        name: _prefill_then_decode(models[name], tokens, len(prompt))
        for name in ("triton", "torch", "truth")
    }
    logits = {name: rows[-1] for name, rows in sequences.items()}
    truth = logits["truth"]
    error = max((logits[name] - truth).abs().max() for name in ("triton", "torch"))
    gap = (truth[theirs[step]] - truth[ours[step]]).abs()
    assert gap <= 2 * error, (
        f"greedy tokens diverge at step {step} ({ours[step]} vs {theirs[step]}) where the float32 "
        f"logits differ by {gap:.4f}, more than twice the backends' error {error:.4f}: not a tie"
    )
    # The stated tolerance holds over the sequence, not at every position: on the H200 (seventh
    # session, benchmarks/grouped_gemv_diag.py --drift) both bf16 backends have single positions
    # 8-13% off the float32 truth (torch at 80 and 85, triton at 70 and 80 of this prompt's
    # continuation) and 0.5-0.7% everywhere else.
    assert relative_error(sequences["triton"], sequences["truth"]) < 0.05


def test_a_decode_step_captures_in_a_cuda_graph(models):
    """Every Triton op of a decode step (and the sampler) runs without host syncs: capture works and
    the replay gives the eager step's logits and token."""
    from gossamer.kernels.sampling import sample

    model = models["triton"]
    prompt = _prompt(20, seed=3)
    cache = ContiguousCache(model, 32)
    forward_tokens(model, cache, prompt, 0)
    position = len(prompt)
    ids = torch.tensor([prompt[-1]], device="cuda")
    positions = torch.tensor([position], device="cuda")
    metadata = cache.metadata(position, 1)
    params = dict(
        temperature=torch.ones(1, device="cuda"),
        seeds=torch.tensor([7], device="cuda"),
        steps=torch.tensor([0], device="cuda"),
        top_p=torch.full((1,), 0.9, device="cuda"),
    )

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        logits = model.compute_logits(model(ids, positions, metadata, cache.kv_cache))
        return logits, sample(logits, **params)

    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager_logits, eager_token = step()  # warm-up: compiles every kernel
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_logits, graph_token = step()
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(graph_logits, eager_logits)
    assert torch.equal(graph_token, eager_token)


def _replayed_decode_logits(model, pdl_on: bool, tokens: list[int]) -> torch.Tensor:
    """One decode step captured in a CUDA graph, replayed back to back for each token in `tokens`
    (the input buffer changes between replays, so a kernel that read a buffer before its
    predecessor wrote it would see the previous replay's values)."""
    from gossamer.kernels import pdl

    saved, pdl.ENABLED = pdl.ENABLED, pdl_on
    try:
        prompt = _prompt(20, seed=4)
        cache = ContiguousCache(model, 32)
        forward_tokens(model, cache, prompt, 0)
        ids = torch.tensor([prompt[-1]], device="cuda")
        positions = torch.tensor([len(prompt)], device="cuda")
        metadata = cache.metadata(len(prompt), 1)
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                model.compute_logits(model(ids, positions, metadata, cache.kv_cache))  # compile
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = model.compute_logits(model(ids, positions, metadata, cache.kv_cache))
            rows = []
            for token in tokens:
                ids.fill_(token)
                graph.replay()
                rows.append(logits.clone())
            torch.cuda.synchronize()
        return torch.cat(rows)
    finally:
        pdl.ENABLED = saved


def test_programmatic_dependent_launch_changes_no_bit(models):
    """Kernels launched with PDL (gossamer/kernels/pdl.py) start before their predecessor ends and
    wait inside; a missing wait would read stale activations. Graph replays with PDL on give
    exactly the logits of replays with PDL off."""
    tokens = _prompt(48, seed=5)
    with_pdl = _replayed_decode_logits(models["triton"], True, tokens)
    without = _replayed_decode_logits(models["triton"], False, tokens)
    assert torch.equal(with_pdl, without)
    assert not torch.equal(with_pdl[0], with_pdl[1])  # the inputs did change between replays
