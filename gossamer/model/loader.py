"""One entry point from a model name (checkpoint folder or preset) to a ready model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gossamer.config import ConfigError, ModelConfig
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.model.weights import (
    build_model,
    check_expert_scales,
    init_dummy_weights,
    is_mxfp4_checkpoint,
    load_checkpoint,
    pack_dense_for_gpu,
    repack_experts_for_gpu,
)
from gossamer.ops import get_ops
from gossamer.presets import PRESETS, preset

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    model: GptOssForCausalLM
    config: ModelConfig
    checkpoint: Path | None  # None for dummy weights of a preset


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_model(
    model: str,
    *,
    load_format: str = "auto",
    dtype: str | torch.dtype = "bfloat16",
    device: str = "cpu",
    ops: str = "auto",
    max_model_len: int | None = None,
    seed: int = 0,
    mxfp4_layout: str | None = None,
) -> LoadedModel:
    """`model` is a checkpoint folder or a preset name; `load_format` is auto or dummy;
    `mxfp4_layout`: the experts' bit layout for the Triton ops on the GPU (None:
    mxfp4.gpu_layout())."""
    torch_dtype = resolve_dtype(dtype)
    path = Path(model)
    if path.is_dir():
        config, checkpoint = ModelConfig.from_hf(path), path
    elif model.removeprefix("openai/") in PRESETS:
        config, checkpoint = preset(model), None
    else:
        raise ConfigError(
            f"model {model!r} is neither a checkpoint folder nor a preset ({sorted(PRESETS)})"
        )
    if load_format not in ("auto", "dummy"):
        raise ConfigError("load_format must be 'auto' or 'dummy'")
    if checkpoint is None and load_format != "dummy":
        raise ConfigError(
            f"{model} is a preset without local weights; pass --load-format dummy for random "
            "weights or --model PATH for a downloaded checkpoint"
        )
    mxfp4 = load_format == "dummy" or is_mxfp4_checkpoint(checkpoint)
    backend = get_ops(ops, device)
    net = build_model(
        config,
        backend,
        mxfp4_experts=mxfp4,
        dtype=torch_dtype,
        device=device,
        max_model_len=max_model_len,
    )
    if load_format == "dummy":
        init_dummy_weights(net, seed)
    else:
        load_checkpoint(net, checkpoint)
    if backend.name == "triton":
        check_expert_scales(net)
    if backend.name == "triton" and net.device.type == "cuda":
        repack_experts_for_gpu(net, mxfp4_layout)
        _register_packed_copies(net)
    return LoadedModel(net, config, checkpoint)


def _register_packed_copies(net: GptOssForCausalLM) -> None:
    """The Triton kernels' packed copies of the weights, where switched on (after the loads and
    the experts' layout repack: they copy the bits as they are then)."""
    from gossamer.kernels import gemv  # the kernels load only where they run

    if gemv.USE_PACKED:
        pack_dense_for_gpu(net)
