"""`gossamer generate`: offline generation from one prompt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from gossamer.config import ConfigError
from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.errors import RequestError
from gossamer.model import mxfp4
from gossamer.model.loader import LoadedModel, load_model
from gossamer.models import default_model_path
from gossamer.sampling_params import SamplingParams


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
    parser.add_argument(
        "--mxfp4-layout",
        choices=mxfp4.LAYOUTS,
        default=None,
        help="bit layout of the MXFP4 experts for the Triton ops on the GPU (default: "
        "GOSSAMER_MXFP4_LAYOUT, else fp16_lanes, the fastest at batch 1; the lanes_* layouts "
        "trade batch-1 decode for batched throughput, see BENCHMARKS.md)",
    )


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
        mxfp4_layout=getattr(args, "mxfp4_layout", None),
    )


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_from_args(args)
        tokenizer = _tokenizer_for(loaded, needed=args.prompt is not None)
        prompt_ids = _prompt_ids(args, tokenizer)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
    engine = EngineCore(loaded.model, tokenizer, _one_request_config(prompt_ids, args.max_tokens))
    try:
        engine.add_request("generate", prompt_ids, params)
    except RequestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    token_ids: list[int] = []
    text = ""
    while engine.has_unfinished_requests():
        for output in engine.step():
            token_ids += output.new_token_ids
            text += output.text_delta
            if not args.json:
                print(output.text_delta, end="", flush=True)
    if args.json:
        print(json.dumps({"token_ids": token_ids, "text": text}))
    elif tokenizer is None:
        print(",".join(map(str, token_ids)))
    else:
        print()
    return 0


def _one_request_config(prompt_ids: list[int], max_tokens: int) -> EngineConfig:
    """A KV cache just large enough for this one request (two cache groups at most)."""
    block_size = 16
    blocks = -(-(len(prompt_ids) + max_tokens) // block_size)
    return EngineConfig(block_size=block_size, max_num_seqs=1, num_blocks=2 * blocks + 2)


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
