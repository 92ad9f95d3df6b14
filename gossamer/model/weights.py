"""Checkpoint loading and writing in the Hugging Face GPT-OSS layout.

Reads single or sharded safetensors one shard at a time, copying each tensor straight into the
preallocated (device) parameter, so host memory never holds more than one shard and MXFP4 experts stay
packed. Writes checkpoints in the official format (experts as MXFP4 `*_blocks` / `*_scales`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from gossamer.config import ModelConfig
from gossamer.model import mxfp4
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.ops.base import Ops

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
QKV = re.compile(r"(model\.layers\.\d+\.self_attn)\.([qkv])_proj\.(weight|bias)$")
DENSE_EXPERTS = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
MXFP4_QUANTIZATION = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


class CheckpointError(ValueError):
    """A checkpoint folder that does not hold what a GPT-OSS model needs."""


def shard_files(path: Path) -> list[Path]:
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"no safetensors files in {path}")
    return found


def checkpoint_keys(path: Path) -> set[str]:
    if (path / INDEX_FILE).is_file():
        return set(json.loads((path / INDEX_FILE).read_text())["weight_map"])
    keys: set[str] = set()
    for file in shard_files(path):
        with safe_open(str(file), framework="pt") as f:
            keys.update(f.keys())
    return keys


def is_mxfp4_checkpoint(path: Path) -> bool:
    return any(key.endswith("_blocks") for key in checkpoint_keys(path))


def build_model(
    config: ModelConfig,
    ops: Ops,
    *,
    mxfp4_experts: bool,
    dtype: torch.dtype,
    device: torch.device | str,
    max_model_len: int | None = None,
) -> GptOssForCausalLM:
    """Allocate an uninitialised model directly on `device` (no host copy of the weights)."""
    with torch.device(device):
        return GptOssForCausalLM(
            config, ops, mxfp4=mxfp4_experts, dtype=dtype, max_model_len=max_model_len
        )


def load_checkpoint(model: GptOssForCausalLM, path: str | Path, progress: bool = True) -> None:
    """Copy every tensor of a HF checkpoint into `model`. Unknown or missing tensors raise."""
    path = Path(path)
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    filled: set[str] = set()
    unknown: list[str] = []
    files = shard_files(path)
    for file in tqdm(files, desc="loading shards", disable=not progress or len(files) < 2):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if not _copy_tensor(model, targets, key, f.get_tensor(key), filled):
                    unknown.append(key)
    if unknown:
        raise CheckpointError(f"{path}: tensors Gossamer does not know: {_short_list(unknown)}")
    missing = sorted(set(targets) - filled)
    if missing:
        raise CheckpointError(
            f"{path}: tensors missing from the checkpoint: {_short_list(missing)}"
        )


def _copy_tensor(
    model: GptOssForCausalLM,
    targets: dict[str, torch.Tensor],
    key: str,
    tensor: torch.Tensor,
    filled: set[str],
) -> bool:
    """Place one checkpoint tensor; False when the name is unknown."""
    cfg = model.config
    if match := QKV.match(key):
        prefix, which, kind = match.groups()
        name = f"{prefix}.qkv_proj.{kind}"
        offset = {"q": 0, "k": cfg.q_size, "v": cfg.q_size + cfg.kv_size}[which]
        size = cfg.q_size if which == "q" else cfg.kv_size
        target = targets[name].narrow(0, offset, size)
        filled.add(f"{name}#{which}")
        if all(f"{name}#{part}" in filled for part in "qkv"):
            filled.add(name)
    elif match := DENSE_EXPERTS.match(key):
        name = key
        tensor = tensor.transpose(1, 2)  # HF stores [E, in, out]; we keep [E, out, in]
        target = targets.get(name)
    else:
        name = key
        target = targets.get(name)
    if target is None:
        return False
    if tuple(target.shape) != tuple(tensor.shape):
        raise CheckpointError(
            f"tensor {key} has shape {tuple(tensor.shape)}; the config needs {tuple(target.shape)}"
        )
    target.copy_(tensor.to(target.dtype))
    filled.add(name)
    return True


def _short_list(names: list[str], limit: int = 8) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def init_dummy_weights(model: GptOssForCausalLM, seed: int = 0) -> None:
    """Random weights of the right shapes, made on the model's device in the packed layout.

    Magnitudes resemble a trained model's so that benchmarks exercise real values, never zeros."""
    generator = torch.Generator(device=model.device).manual_seed(seed)
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("_blocks"):
            tensor.copy_(_randint(tensor, 0, 256, generator))
        elif name.endswith("_scales"):
            # Scales around 2^-6 give elements of 0.01-0.1, like trained experts.
            tensor.copy_(_randint(tensor, mxfp4.SCALE_BIAS - 8, mxfp4.SCALE_BIAS - 5, generator))
        elif "layernorm" in name or name == "model.norm.weight":
            tensor.copy_(1.0 + 0.02 * _normal(tensor, generator))
        else:
            tensor.copy_(0.02 * _normal(tensor, generator))


def _randint(like: torch.Tensor, low: int, high: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(
        low, high, like.shape, generator=generator, device=like.device, dtype=torch.uint8
    )


def _normal(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, device=like.device, dtype=torch.float32)


def count_parameters(model: GptOssForCausalLM) -> int:
    """Parameters as the published model counts them: each MXFP4 byte holds two weights."""
    total = 0
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("_blocks"):
            total += 2 * tensor.numel()
        elif not name.endswith("_scales"):
            total += tensor.numel()
    return total


def weight_nbytes(model: GptOssForCausalLM) -> int:
    """Bytes the weights occupy in memory, packed experts and their scales included."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if t is not model.cos_sin)


def hf_state_dict(
    model: GptOssForCausalLM, experts_format: str = "mxfp4"
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) pairs in the Hugging Face layout, one at a time."""
    cfg = model.config
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        tensor = tensor.detach().cpu()
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            prefix, kind = name.rsplit(".qkv_proj.", 1)
            parts = tensor.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=0)
            for which, part in zip("qkv", parts, strict=True):
                yield f"{prefix}.{which}_proj.{kind}", part.contiguous()
        elif DENSE_EXPERTS.match(name):
            yield from _dense_experts_out(name, tensor, experts_format)
        elif name.endswith("_blocks") and _blocks_layout(model, name) != mxfp4.LAYOUT_HF:
            yield name, mxfp4.repack(tensor, _blocks_layout(model, name), mxfp4.LAYOUT_HF)
        else:
            yield name, tensor.contiguous()


def _blocks_layout(model: GptOssForCausalLM, name: str) -> str:
    return model.get_submodule(name.rsplit(".", 1)[0]).blocks_layout


def repack_experts_for_gpu(model: GptOssForCausalLM, layout: str | None = None) -> int:
    """Repack every MXFP4 expert's blocks in place to `layout`, by default mxfp4.gpu_layout()
    (the Triton kernels' cheaper unpacks); returns how many expert modules changed. Only for a
    model that runs the Triton ops: the torch reference reads every layout, more slowly."""
    return set_experts_layout(model, layout or mxfp4.gpu_layout())


def check_expert_scales(model: GptOssForCausalLM) -> int:
    """Raise CheckpointError if an MXFP4 expert's scale exponent is above what the Triton kernels
    decode (mxfp4.KERNEL_MAX_SCALE; one reduction a tensor); returns how many were checked."""
    checked = 0
    for name, module in model.named_modules():
        if getattr(module, "blocks_layout", None) is None or not module.mxfp4:
            continue
        for attr in ("gate_up_proj_scales", "down_proj_scales"):
            scales = getattr(module, attr)
            largest = int(scales.max()) if scales.numel() else 0
            if largest > mxfp4.KERNEL_MAX_SCALE:
                raise CheckpointError(
                    f"{name}.{attr}: MXFP4 scale exponent {largest} (2^{largest - mxfp4.SCALE_BIAS}"
                    f", NaN if 255) is above {mxfp4.KERNEL_MAX_SCALE}, the largest the Triton "
                    "kernels decode"
                )
            checked += 1
    return checked


def pack_dense_for_gpu(model: GptOssForCausalLM, tiles: tuple[tuple[int, int], ...] = ()) -> int:
    """Register a tile-packed copy of every QKV and O weight for the batch-1 GEMV (gemv.USE_PACKED:
    each program's tiles one contiguous run), in the tile of its default plan and in each of
    `tiles` (rows, columns: for configs tried in benchmarks); returns how many copies.
    The row-major weights stay: cuBLAS and other tiles read them."""
    from gossamer.kernels import gemv

    packed = 0
    for layer in model.model.layers:
        for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
            config = gemv.default_config(1, *proj.weight.shape)
            wanted = set(tiles)
            if config.kernel == "dot" and config.block_k != gemv.WHOLE_K:
                wanted.add((config.block_n, config.block_k))
            for block_n, block_k in sorted(wanted):
                gemv.register_packed(proj.weight, block_n, block_k)
                packed += 1
    return packed


def set_experts_layout(model: GptOssForCausalLM, layout: str) -> int:
    """Repack every MXFP4 expert's blocks in place to `layout` (both directions are bit
    permutations); returns how many expert modules changed."""
    mxfp4.element_bits(layout, 0)  # an unknown layout raises before anything moves
    changed = 0
    for module in model.modules():
        current = getattr(module, "blocks_layout", None)
        if current is None or current == layout or not module.mxfp4:
            continue
        for blocks in (module.gate_up_proj_blocks, module.down_proj_blocks):
            blocks.copy_(mxfp4.repack(blocks, current, layout))
        module.blocks_layout = layout
        changed += 1
    return changed


def _dense_experts_out(
    name: str, tensor: torch.Tensor, experts_format: str
) -> Iterator[tuple[str, torch.Tensor]]:
    if experts_format == "mxfp4":
        blocks, scales = mxfp4.quantize(tensor)  # tensor is [E, out, in]: blocks run along `in`
        yield f"{name}_blocks", blocks
        yield f"{name}_scales", scales
    else:
        yield name, tensor.transpose(1, 2).contiguous()


def save_checkpoint(
    model: GptOssForCausalLM,
    out_dir: str | Path,
    *,
    experts_format: str = "mxfp4",
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Write `model` as a HF checkpoint: config.json and safetensors shards (+ index if sharded).

    experts_format "mxfp4" is the official layout (dense experts are quantized on the way out);
    "dense" writes transformers' unquantized [E, in, out] tensors."""
    if experts_format not in ("mxfp4", "dense"):
        raise ValueError("experts_format must be 'mxfp4' or 'dense'")
    if model.mxfp4 and experts_format == "dense":
        raise ValueError("this model holds packed experts; write it as mxfp4")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes = 0
    for name, tensor in hf_state_dict(model, experts_format):
        if tensor.is_floating_point():
            tensor = tensor.to(dtype)
        size = tensor.numel() * tensor.element_size()
        if shard_bytes + size > max_shard_bytes and shards[-1]:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += size
    _write_shards(out, shards)
    config = model.config.to_hf() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    if experts_format == "mxfp4":
        config["quantization_config"] = MXFP4_QUANTIZATION
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _write_shards(out: Path, shards: list[dict[str, torch.Tensor]]) -> None:
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / SINGLE_FILE), metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file_name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file_name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, file_name))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
