"""Why the expert-grouped GEMV failed tests/kernels/test_triton_model.py on the H200 (sixth session).

    GOSSAMER_GROUPED_GEMV_MAX_PAIRS=128 python benchmarks/grouped_gemv_diag.py
    # on the CPU (interpreted kernels, float32): TRITON_INTERPRET=1 ... --device cpu

Builds that test's small model (the same seed and shapes), runs its 24-token prefill with the
Triton ops and records every MoE call: its inputs (x, router logits) and the output the model got.
Then, per layer, on the recorded inputs and after a device sync:
- `alone`: the same entry point (moe_mxfp4.moe_mxfp4) run again, by itself;
- `gemv`: the expert-grouped GEMV called directly; `v2`: the grouped tensor-core path; `decode`:
  the packed-fp16 decode GEMV (any token count works there, it only reads more bytes);
- `ref`: TorchOps().moe in float32 on the same weights (the torch model's copy, published layout).
It prints each one's error against `ref` (max |diff| / max |ref|), whether the in-model output equals
`alone` bit for bit (unequal: the result depends on what ran around it, i.e. a race), and for the
worst layer the per-token errors with each token's experts. Nothing is asserted: a diagnosis.
With --drift N: instead, both bf16 backends' logits error against the float32 truth at every
position of a 24-token prefill and N greedy decode steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossamer.engine.reference import ContiguousCache, forward_tokens, generate_stream  # noqa: E402
from gossamer.kernels import moe_mxfp4, pdl  # noqa: E402
from gossamer.model.loader import load_model  # noqa: E402
from gossamer.model.weights import save_checkpoint  # noqa: E402
from gossamer.ops.torch_ref import TorchOps  # noqa: E402
from tests.hf_models import write_hf_model  # noqa: E402
from tests.kernels.test_triton_model import SMALL, _prompt  # noqa: E402


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max())


def _reference(x, logits, experts, top_k, limit, alpha) -> torch.Tensor:
    fp32 = dataclasses.replace(
        experts, gate_up_bias=experts.gate_up_bias.float(), down_bias=experts.down_bias.float()
    )
    return TorchOps().moe(x.float(), logits.float(), fp32, top_k, limit, alpha)


def _record_moe_calls(model, prompt: list[int]) -> list[dict]:
    """Run the prefill with moe_mxfp4.moe_mxfp4 wrapped; the calls in layer order."""
    calls: list[dict] = []
    original = moe_mxfp4.moe_mxfp4

    def recording(x, logits, experts, top_k, limit, alpha):
        out = original(x, logits, experts, top_k, limit, alpha)
        calls.append(dict(x=x.clone(), logits=logits.clone(), out=out.clone(), experts=experts,
                          top_k=top_k, limit=limit, alpha=alpha))  # fmt: skip
        return out

    moe_mxfp4.moe_mxfp4 = recording
    try:
        forward_tokens(model, ContiguousCache(model, len(prompt) + 8), prompt, 0)
    finally:
        moe_mxfp4.moe_mxfp4 = original
    _sync(model.device)
    return calls


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _variants(call: dict) -> dict[str, torch.Tensor]:
    from gossamer.kernels.moe_grouped_gemv import moe_mxfp4_grouped_gemv

    args = (call["x"], call["logits"], call["experts"], call["top_k"], call["limit"],
            call["alpha"])  # fmt: skip
    results = {"alone": moe_mxfp4.moe_mxfp4(*args)}
    _sync(call["x"].device)
    results["alone_again"] = moe_mxfp4.moe_mxfp4(*args)
    results["gemv"] = moe_mxfp4_grouped_gemv(*args)
    results["v2"] = moe_mxfp4.moe_mxfp4_grouped_v2(*args)
    results["decode"] = moe_mxfp4.moe_mxfp4_decode_fp16(*args)
    _sync(call["x"].device)
    return results


def _per_token(call: dict, ref: torch.Tensor) -> None:
    """The worst layer's tokens: error, experts, |x| max."""
    ids = torch.topk(call["logits"].float(), call["top_k"], dim=-1).indices.tolist()
    scale = ref.abs().max()
    for t in range(ref.shape[0]):
        err = float((call["out"][t].float() - ref[t]).abs().max() / scale)
        amax = float(call["x"][t].float().abs().max())
        print(f"    token {t:2d}: error {err:.4f} experts {ids[t]} max|x| {amax:.3g}")


def _drift(models: dict, prompt: list[int], steps: int) -> None:
    """Each backend's error against the float32 truth at every position of the torch bf16 model's
    greedy continuation (the tokens test_greedy_tokens_agree_for_64_steps checks at a divergence;
    it never looks at them when the two backends agree)."""
    from tests.kernels.test_triton_model import _prefill_then_decode, relative_error

    tokens = prompt + list(generate_stream(models["torch"], prompt, steps))
    logits = {name: _prefill_then_decode(m, tokens, len(prompt)) for name, m in models.items()}
    truth = logits.pop("truth")
    print("position: " + ", ".join(f"{name} error" for name in logits))
    for position in range(truth.shape[0]):
        errors = [relative_error(rows[position], truth[position]) for rows in logits.values()]
        flag = "  <-- over 5%" if max(errors) > 0.05 else ""
        print(f"  {position:3d}: " + ", ".join(f"{e:.4f}" for e in errors) + flag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--drift", type=int, default=0, help="steps: print errors per position")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    print(f"PDL {pdl.enabled(device)}; GROUPED_GEMV_MAX_PAIRS {moe_mxfp4.GROUPED_GEMV_MAX_PAIRS}; "
          f"DECODE_MAX_PAIRS {moe_mxfp4.DECODE_MAX_PAIRS}; {dtype} on {device}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf_dir = write_hf_model(root / "hf", seed=21, **SMALL)
        dense = load_model(str(hf_dir), dtype="float32").model
        packed = save_checkpoint(dense, root / "mxfp4")
        triton_model = load_model(str(packed), dtype=dtype, device=args.device, ops="triton").model
        torch_model = load_model(str(packed), dtype=dtype, device=args.device, ops="torch").model
        if args.drift:
            truth = load_model(str(packed), dtype="float32", device=args.device, ops="torch").model
            models = {"triton": triton_model, "torch": torch_model, "truth": truth}
            _drift(models, _prompt(args.prompt_len, seed=2), args.drift)
            return
    calls = _record_moe_calls(triton_model, _prompt(args.prompt_len, seed=2))
    worst = (0.0, None, None)
    for layer, call in enumerate(calls):
        published = torch_model.model.layers[layer].mlp.experts.weights()
        ref = _reference(call["x"], call["logits"], published, call["top_k"], call["limit"],
                         call["alpha"])  # fmt: skip
        results = _variants(call)
        errors = {"model": _error(call["out"], ref)}
        errors |= {name: _error(out, ref) for name, out in results.items()}
        same = torch.equal(call["out"], results["alone"])
        deterministic = torch.equal(results["alone"], results["alone_again"])
        counts = torch.bincount(torch.topk(call["logits"].float(), call["top_k"]).indices.flatten(),
                                minlength=call["logits"].shape[1]).tolist()  # fmt: skip
        print(f"layer {layer}: tokens {call['x'].shape[0]} experts per pair {counts}")
        print("  errors vs float32 ref: " + ", ".join(f"{k} {v:.4f}" for k, v in errors.items()))
        print(f"  model == alone: {same}; alone == alone again: {deterministic}")
        if errors["model"] > worst[0]:
            worst = (errors["model"], call, ref)
    if worst[1] is not None:
        print(f"worst layer error {worst[0]:.4f}, per token:")
        _per_token(worst[1], worst[2])


if __name__ == "__main__":
    main()
