"""Write the trained model as a Hugging Face GPT-OSS checkpoint folder.

export_bf16(): config.json, generation_config.json, tokenizer.json and a bfloat16
model.safetensors whose tensor names and layouts are transformers' GptOssForCausalLM's.
convert_to_mxfp4(): the shipped form, experts packed as MXFP4 like the published checkpoints.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import fields
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from gossamer.config import ModelConfig, RopeScaling
from tools.mini.chat import CALL, ENDOFTEXT, RETURN, STARTOFTEXT
from tools.mini.model import MiniConfig, MiniGptOss

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SIDE_FILES = ("tokenizer.json", "generation_config.json")


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    names = {"bos": STARTOFTEXT, "pad": ENDOFTEXT, "return": RETURN, "end": ENDOFTEXT, "call": CALL}
    ids = {key: tokenizer.token_to_id(token) for key, token in names.items()}
    missing = [names[k] for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"tokenizer lacks the Harmony special tokens {missing}")
    return ids


def model_config(config: MiniConfig, tokenizer: Tokenizer) -> ModelConfig:
    """The project's config object for this model (it writes the HF config.json)."""
    ids = special_ids(tokenizer)
    return ModelConfig(
        num_hidden_layers=config.num_hidden_layers,
        num_local_experts=config.num_local_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        sliding_window=config.sliding_window,
        layer_types=config.layer_types,
        rope_theta=config.rope_theta,
        rope_scaling=RopeScaling(
            factor=config.rope_factor,
            original_max_position_embeddings=config.rope_original_max_position_embeddings,
            beta_fast=config.rope_beta_fast,
            beta_slow=config.rope_beta_slow,
            truncate=False,
        ),
        max_position_embeddings=config.max_position_embeddings,
        swiglu_limit=config.swiglu_limit,
        swiglu_alpha=config.swiglu_alpha,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=False,
        # The published stop set: <|return|>, <|endoftext|>, <|call|>.
        eos_token_ids=(ids["return"], ids["end"], ids["call"]),
        pad_token_id=ids["pad"],
    )


def mini_config_from(config: ModelConfig) -> MiniConfig:
    """The inverse of model_config(): a checkpoint's config as the training twin's."""
    rope = config.rope_scaling or RopeScaling(factor=1.0)  # factor 1: plain RoPE
    shared = {
        f.name: getattr(config, f.name) for f in fields(MiniConfig) if hasattr(config, f.name)
    }
    return MiniConfig(
        **shared,
        rope_factor=rope.factor,
        rope_original_max_position_embeddings=rope.original_max_position_embeddings,
        rope_beta_fast=rope.beta_fast,
        rope_beta_slow=rope.beta_slow,
    )


def generation_config(tokenizer: Tokenizer) -> dict:
    ids = special_ids(tokenizer)
    return {
        "bos_token_id": ids["bos"],
        "do_sample": True,
        "eos_token_id": [ids["return"], ids["end"], ids["call"]],
        "pad_token_id": ids["pad"],
    }


def export_bf16(
    model: MiniGptOss, tokenizer_path: Path, out_dir: Path, extra_config: dict | None = None
) -> Path:
    """The bfloat16 checkpoint (dense experts in transformers' [E, in, out] layout)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    state = {
        name: tensor.detach().to("cpu", torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
    }
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = model_config(model.config, tokenizer).to_hf() | {"torch_dtype": "bfloat16"}
    config |= extra_config or {}
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", generation_config(tokenizer))
    shutil.copyfile(tokenizer_path, out_dir / "tokenizer.json")
    return out_dir


def convert_to_mxfp4(bf16_dir: Path, out_dir: Path, max_shard_bytes: int | None = None) -> Path:
    """HOOK (issue 6): turn the bf16 checkpoint into the shipped one, experts packed as MXFP4.

    The MXFP4 format belongs to gossamer.model (the engine's loader reads what its writer
    writes), so this calls the project's writer: gossamer's model loads the bf16 checkpoint and
    gossamer.model.weights.save_checkpoint(experts_format="mxfp4") writes it. Should that API
    move, a direct writer over gossamer.model.mxfp4.quantize takes over (with a warning), so a
    long GPU run never ends without its checkpoint; tests hold the two outputs equal.
    `max_shard_bytes` splits the weights into model-0000N-of-0000M.safetensors + index.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        _convert_with_gossamer_model(bf16_dir, out_dir, max_shard_bytes)
    except Exception as error:  # noqa: BLE001 - any API drift: fall back, loudly
        message = f"gossamer's checkpoint writer failed ({error!r}); writing directly"
        warnings.warn(message, stacklevel=2)
        for stale in out_dir.glob("model*.safetensors*"):
            stale.unlink()
        convert_directly(bf16_dir, out_dir, max_shard_bytes)
    for name in SIDE_FILES:
        shutil.copyfile(bf16_dir / name, out_dir / name)
    # Keep the training metadata (e.g. the corpus description) the bf16 config carried.
    source = json.loads((bf16_dir / "config.json").read_text())
    written = json.loads((out_dir / "config.json").read_text())
    _write_json(out_dir / "config.json", source | written)
    return out_dir


def _convert_with_gossamer_model(
    bf16_dir: Path, out_dir: Path, max_shard_bytes: int | None
) -> None:
    from gossamer.model import weights
    from gossamer.ops import get_ops

    config = ModelConfig.from_hf(bf16_dir)
    model = weights.build_model(
        config, get_ops("torch", "cpu"), mxfp4_experts=False, dtype=torch.bfloat16, device="cpu"
    )
    weights.load_checkpoint(model, bf16_dir, progress=False)
    shard = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
    weights.save_checkpoint(model, out_dir, experts_format="mxfp4", dtype=torch.bfloat16, **shard)


def convert_directly(bf16_dir: Path, out_dir: Path, max_shard_bytes: int | None = None) -> None:
    """Fallback writer: pack the experts with gossamer.model.mxfp4.quantize, copy the rest."""
    from gossamer.model import mxfp4
    from gossamer.model.weights import MXFP4_QUANTIZATION

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(bf16_dir).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # HF dense experts are [E, in, out]; MXFP4 blocks run along `in` of [E, out, in].
            blocks, scales = mxfp4.quantize(tensor.transpose(1, 2).contiguous())
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        else:
            tensors[name] = tensor
    write_safetensors(tensors, out_dir, max_shard_bytes)
    config = json.loads((bf16_dir / "config.json").read_text())
    config["quantization_config"] = MXFP4_QUANTIZATION
    _write_json(out_dir / "config.json", config)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder (one file or shards)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            tensors |= {name: f.get_tensor(name) for name in f.keys()}
    return tensors


def write_safetensors(
    tensors: dict[str, torch.Tensor], out_dir: Path, max_shard_bytes: int | None
) -> None:
    """One model.safetensors, or shards of at most max_shard_bytes plus the HF index."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / file_name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file_name)
    _write_json(out_dir / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def merge_shards(folder: Path) -> None:
    """Rewrite a sharded checkpoint folder as one model.safetensors (for shipping in the package:
    the device run writes shards because only files under 16 MiB come back from it)."""
    tensors = read_tensors(folder)
    for shard in folder.glob("model*.safetensors*"):
        shard.unlink()
    write_safetensors(tensors, folder, None)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="merge a sharded checkpoint into one file")
    parser.add_argument("--merge", type=Path, required=True, help="checkpoint folder")
    merge_shards(parser.parse_args().merge)
