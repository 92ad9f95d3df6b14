"""What an fp8 KV cache costs in accuracy: the built-in model (gpt-oss-mini, trained) scores the
same text over a cache in the model's dtype and over an fp8 (e4m3, unscaled) cache.

The text is Python standard-library source (what the model was trained on; the modules named
below, read from this interpreter's install, so any machine has them). Each window of --window
tokens is fed in chunks of --chunk tokens through the single-sequence reference path
(gossamer/engine/reference.py), so every chunk's queries read the keys and values of the earlier
chunks back from the cache, where the fp8 rounding happens. Reported per cache dtype: the mean
negative log-likelihood of the next token (and its perplexity); against the exact cache: how often
the top-1 token agrees and the largest change of a log-probability.

This measures the mini model, not gpt-oss-120b: its keys and values have other ranges. It says
whether the fp8 path is sound and how large e4m3 rounding is next to a model's own error, not
what a real checkpoint loses.

    python benchmarks/kv_cache_accuracy.py                 # CPU, float32 model, ~1 min
    python benchmarks/kv_cache_accuracy.py --device cuda   # bf16 model, Triton kernels
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
from dataclasses import asdict, dataclass

import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.tokenizer import Tokenizer

MODULES = ("json.decoder", "textwrap", "argparse", "shlex", "fractions", "string")


@dataclass
class Result:
    cache_dtype: str
    tokens: int
    mean_nll: float
    perplexity: float
    top1_agreement: float  # with the exact cache
    max_logprob_change: float  # over all tokens and the whole vocabulary


def windows(tokenizer: Tokenizer, size: int, count: int) -> list[list[int]]:
    """Up to `count` windows of `size` tokens, one module after another."""
    out: list[list[int]] = []
    for name in MODULES:
        ids = tokenizer.encode(inspect.getsource(importlib.import_module(name)))
        out += [ids[i : i + size] for i in range(0, len(ids) - size + 1, size)]
    return out[:count]


@torch.inference_mode()
def log_probs(model, tokens: list[int], chunk: int, cache_dtype: torch.dtype) -> torch.Tensor:
    """float32 [len - 1, vocab]: log-probabilities of each next token, fed chunk by chunk."""
    cache = ContiguousCache(model, len(tokens))
    cache.kv_cache = cache.kv_cache.to(cache_dtype)
    logits = [
        forward_tokens(model, cache, tokens[start : start + chunk], start)
        for start in range(0, len(tokens), chunk)
    ]
    return torch.log_softmax(torch.cat(logits)[:-1].float(), dim=-1)


def measure(model, texts: list[list[int]], chunk: int, dtypes: dict) -> list[Result]:
    exact_name = next(iter(dtypes))
    per_dtype: dict[str, list[torch.Tensor]] = {name: [] for name in dtypes}
    targets = []
    for tokens in texts:
        targets.append(torch.tensor(tokens[1:], device=model.device))
        for name, dtype in dtypes.items():
            per_dtype[name].append(log_probs(model, tokens, chunk, dtype))
    target = torch.cat(targets)
    exact = torch.cat(per_dtype[exact_name])
    results = []
    for name, parts in per_dtype.items():
        lp = torch.cat(parts)
        nll = -lp.gather(1, target[:, None]).mean().item()
        results.append(
            Result(
                cache_dtype=name,
                tokens=len(target),
                mean_nll=nll,
                perplexity=float(torch.tensor(nll).exp()),
                top1_agreement=(lp.argmax(-1) == exact.argmax(-1)).float().mean().item(),
                max_logprob_change=(lp - exact).abs().max().item(),
            )
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=32, help="tokens per forward (cache reads)")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    path = default_model_path()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    model = load_model(str(path), dtype=dtype, device=args.device, max_model_len=args.window).model
    texts = windows(Tokenizer.from_file(path), args.window, args.windows)
    dtypes = {str(model.dtype).removeprefix("torch."): model.dtype, "fp8_e4m3": torch.float8_e4m3fn}
    results = measure(model, texts, args.chunk, dtypes)
    print(f"gpt-oss-mini on {args.device} ({dtype}), {len(texts)} windows of {args.window} tokens")
    print("cache      tokens  mean_nll  perplexity  top1_agree  max|dlogp|")
    for r in results:
        print(
            f"{r.cache_dtype:9s} {r.tokens:7d} {r.mean_nll:9.4f} {r.perplexity:11.3f} "
            f"{r.top1_agreement:11.4f} {r.max_logprob_change:10.4f}"
        )
    if args.json:
        record = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "args": vars(args),
            "results": [asdict(r) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
