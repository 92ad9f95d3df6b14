"""`gossamer generate`: offline generation from one prompt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from gossamer.config import ConfigError
from gossamer.engine.reference import SimpleSampling, generate_stream
from gossamer.model.loader import LoadedModel, load_model
from gossamer.models import default_model_path


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by every command that loads a model."""
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint folder or preset (gpt-oss-120b, gpt-oss-20b); default: built-in model",
    )
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32", "float16"),
        default="auto",
        help="auto: bfloat16 on cuda, float32 on cpu",
    )
    parser.add_argument(
        "--ops", choices=("auto", "torch", "triton"), default="auto", help="op backend"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed-weights", type=int, default=0, help="seed of dummy weights")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (raw, no chat template)")
    prompt.add_argument("--prompt-token-ids", help="comma-separated token ids, e.g. 1,2,3")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return load_model(
        args.model or str(default_model_path()),
        load_format=args.load_format,
        dtype=dtype,
        device=device,
        ops=args.ops,
        max_model_len=args.max_model_len,
        seed=args.seed_weights,
    )


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_from_args(args)
        tokenizer = _tokenizer_for(loaded, needed=args.prompt is not None)
        prompt_ids = _prompt_ids(args, tokenizer)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stop_ids = () if args.ignore_eos else _stop_ids(loaded, tokenizer)
    params = SimpleSampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    stream = generate_stream(loaded.model, prompt_ids, args.max_tokens, params, stop_ids)
    token_ids: list[int] = []
    detokenizer = _detokenizer(tokenizer)
    for token in stream:
        token_ids.append(token)
        if detokenizer is not None and not args.json:
            print(detokenizer.feed(token), end="", flush=True)
    text = tokenizer.decode(token_ids) if tokenizer is not None else ""
    if args.json:
        print(json.dumps({"token_ids": token_ids, "text": text}))
    elif detokenizer is not None:
        print(detokenizer.flush())
    else:
        print(",".join(map(str, token_ids)))
    return 0


def _tokenizer_for(loaded: LoadedModel, needed: bool):
    folder = loaded.checkpoint
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        from gossamer.tokenizer import Tokenizer

        return Tokenizer.from_file(folder)
    if needed:
        raise ConfigError(
            "this model has no tokenizer.json; pass --prompt-token-ids instead of --prompt"
        )
    return None


def _prompt_ids(args: argparse.Namespace, tokenizer) -> list[int]:
    if args.prompt is not None:
        return tokenizer.encode(args.prompt)
    try:
        return [int(part) for part in args.prompt_token_ids.split(",") if part.strip()]
    except ValueError:
        raise ValueError("--prompt-token-ids must be comma-separated integers") from None


def _stop_ids(loaded: LoadedModel, tokenizer) -> tuple[int, ...]:
    if tokenizer is not None and tokenizer.eos_token_ids:
        return tuple(tokenizer.eos_token_ids)
    return loaded.config.eos_token_ids


def _detokenizer(tokenizer):
    if tokenizer is None:
        return None
    from gossamer.tokenizer import IncrementalDetokenizer

    return IncrementalDetokenizer(tokenizer)
