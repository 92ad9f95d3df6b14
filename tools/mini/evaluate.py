"""Held-out loss and perplexity of a gpt-oss-mini checkpoint, computed by transformers.

transformers' GptOssForCausalLM is the independent oracle here: the number measures the checkpoint
as a Hugging Face user would load it, not our training code. MXFP4 experts are unpacked with
transformers' own dequantiser (its MXFP4 from_pretrained path needs `accelerate`, which the
project does not depend on).

    python -m tools.mini.evaluate --checkpoint DIR --tokens /tmp/mini/data --split test
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from tools.mini.export import read_tensors


def load_hf_model(checkpoint: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """transformers' GptOssForCausalLM with the checkpoint's weights, in eval mode.

    Built from config.json and loaded with strict=True (every tensor present, none unknown); as
    from_pretrained does, the RMSNorm weights stay float32 when `dtype` is lower."""
    from transformers import GptOssConfig, GptOssForCausalLM

    raw = json.loads((checkpoint / "config.json").read_text())
    raw.pop("quantization_config", None)
    config = GptOssConfig.from_dict(raw, attn_implementation="eager")
    model = GptOssForCausalLM(config)
    model.load_state_dict(checkpoint_state(checkpoint), strict=True)
    model.to(device=device, dtype=dtype)
    keep_fp32 = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in keep_fp32:
            module.float()
    return model.eval()


def checkpoint_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """All tensors as float32, MXFP4 experts unpacked by transformers' own dequantiser."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed = read_tensors(checkpoint)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in packed.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            # -> [E, in, out], transformers' dense layout
            state[base] = convert_moe_packed_tensors(
                tensor, packed[f"{base}_scales"], dtype=torch.float32
            )
        else:
            state[name] = tensor.float()
    return state


def windows(tokens: np.ndarray, seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """[num_windows, seq_len + 1]: consecutive windows overlapping by one token, so every token
    after the first is predicted exactly once. The incomplete tail is dropped."""
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    count = (len(tokens) - 1) // seq_len
    if count == 0:
        raise ValueError(f"need more than {seq_len} tokens to evaluate; got {len(tokens)}")
    starts = np.arange(count) * seq_len
    index = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(tokens[index].astype(np.int64))


@torch.no_grad()
def mean_loss(logits_fn, batches: torch.Tensor, batch_size: int, device: str) -> float:
    """Mean next-token cross entropy (nats) of logits_fn(input_ids [B, T]) -> [B, T, V]."""
    total, count = 0.0, 0
    for start in range(0, len(batches), batch_size):
        chunk = batches[start : start + batch_size].to(device)
        logits = logits_fn(chunk[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"
        )
        total += loss.item()
        count += chunk[:, 1:].numel()
    return total / count


def evaluate_checkpoint(
    checkpoint: Path,
    tokens_dir: Path,
    split: str = "test",
    *,
    device: str = "cpu",
    seq_len: int = 1024,
    batch_size: int = 8,
    max_tokens: int | None = None,
) -> dict:
    """{"loss", "perplexity", "bits_per_byte", "tokens", ...} of a checkpoint on one split."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = load_hf_model(checkpoint, device, dtype)
    stream = np.load(tokens_dir / f"{split}.npy")
    batches = windows(stream, seq_len, max_tokens)
    started = time.perf_counter()
    loss = mean_loss(lambda ids: model(ids).logits, batches, batch_size, device)
    stats = json.loads((tokens_dir / "tokens.json").read_text())["splits"][split]
    return {
        "checkpoint": str(checkpoint),
        "split": split,
        "loss": loss,
        "perplexity": math.exp(loss),
        # Tokeniser-independent: nats per token * tokens per byte / ln 2 (whole-split average).
        "bits_per_byte": loss * stats["tokens"] / stats["bytes"] / math.log(2),
        "tokens": batches[:, 1:].numel(),
        "seq_len": seq_len,
        "dtype": str(dtype).removeprefix("torch."),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--tokens", type=Path, required=True, help="folder with {split}.npy")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    result = evaluate_checkpoint(
        args.checkpoint,
        args.tokens,
        args.split,
        device=args.device,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
