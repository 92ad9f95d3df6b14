"""The GPU backend: the op interface (ops/base.py) on Triton kernels (gossamer/kernels/).

Every op here is graph-capturable (no host syncs, no value-dependent allocations). The attention and
MoE kernels are imported lazily from gossamer/kernels/attention.py and moe_mxfp4.py; if one of those
files is missing, its op falls back to the torch reference (correct, but it syncs, so CUDA-graph
capture of a decode step fails, and it is slow) with a warning.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from types import ModuleType

import torch

from gossamer.kernels import embed, gemv, norm, rope
from gossamer.ops.base import (
    AttentionMetadata,
    DecodeAdvance,
    ExpertWeights,
    compose_norm_linear,
    compose_norm_moe,
)
from gossamer.ops.torch_ref import TorchOps


class TritonOps:
    name = "triton"

    def __init__(self) -> None:
        self._reference = TorchOps()

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return gemv.linear(x, weight, bias)

    def embed(
        self, input_ids: torch.Tensor, weight: torch.Tensor, fed_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if fed_ids is None:  # torch's indexing kernel; the Triton one serves fed steps (not timed)
            return weight[input_ids]
        return embed.embed(input_ids, weight, fed_ids)

    def logits(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        greedy_out: torch.Tensor | None = None,
        advance: DecodeAdvance | None = None,
    ) -> torch.Tensor:
        return gemv.logits(hidden, weight, greedy_out, advance)

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return norm.rms_norm(x, weight, eps, residual)

    def norm_linear(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        want_normed: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        # the norm kernel, then `linear` (folded into the GEMV's prologue it was slower: gemv.py)
        return compose_norm_linear(
            self, hidden, residual, norm_weight, eps, weight, bias, want_normed
        )

    def rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.rope(q, k, positions, cos_sin)

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write = _kernel("attention", "write_kv")
        if write is None:  # the rope module's copy-only variant: also a graph-safe Triton write
            write = rope.write_kv
        write(k, v, kv_cache, slot_mapping)

    def rope_and_write_kv(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        return rope.rope_and_write_kv(q, k, v, positions, cos_sin, kv_cache, slot_mapping)

    def attention(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        group: int,
        sinks: torch.Tensor,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        attend = _kernel("attention", "attention")
        if attend is None:
            # only where the module is missing (tests that load some kernel modules interpreted)
            attend = self._reference.attention
        return attend(q, kv_cache, metadata, group, sinks, scale, sliding_window)

    def decode_context_bounds(
        self,
        num_seqs: int,
        query_len: int,
        num_kv_heads: int,
        max_seq_len: int,
        device: torch.device,
    ) -> list[int]:
        bounds = _kernel("attention", "decode_context_bounds")
        if bounds is None:
            return []
        return bounds(num_seqs, query_len, num_kv_heads, max_seq_len, device)

    def rope_write_kv_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        metadata: AttentionMetadata,
        group: int,
        sinks: torch.Tensor,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        # Pure decode: one launch (the decode attention kernel rotates and writes the new token's
        # K/V itself); any other batch: the two launches.
        fused = _kernel("attention", "rope_write_kv_attention")
        if fused is not None and _kernel("attention", "fuses_rope_write_kv")(q, metadata):
            return fused(q, k, v, positions, cos_sin, kv_cache, slot_mapping, metadata, group,
                         sinks, scale, sliding_window)  # fmt: skip
        q = self.rope_and_write_kv(q, k, v, positions, cos_sin, kv_cache, slot_mapping)
        return self.attention(q, kv_cache, metadata, group, sinks, scale, sliding_window)

    def moe(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        experts: ExpertWeights,
        top_k: int,
        swiglu_limit: float,
        swiglu_alpha: float,
    ) -> torch.Tensor:
        # MXFP4 and dense experts alike (the kernel module picks its GEMV or grouped path)
        fused = _kernel("moe_mxfp4", "moe_mxfp4")
        if fused is None:
            # only where the module is missing (tests that load some kernel modules interpreted)
            fused = self._reference.moe
        return fused(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha)

    def norm_moe(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        router_weight: torch.Tensor,
        router_bias: torch.Tensor,
        experts: ExpertWeights,
        top_k: int,
        swiglu_limit: float,
        swiglu_alpha: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Decode batches: the norm (also writing the experts' fp16 input), the router GEMV, then
        # the two expert GEMVs, which route themselves (moe_mxfp4.ROUTE_IN_EXPERTS); else the
        # parts.
        moe = _kernel_module("moe_mxfp4")
        args = (router_weight, router_bias, experts, top_k, swiglu_limit, swiglu_alpha)
        checks = (hidden, residual, router_weight, experts, top_k, swiglu_limit)
        if not self._routes_in_experts(moe, checks):
            return compose_norm_moe(self, hidden, residual, norm_weight, eps, *args)
        normed, new_residual, x_h, x_unscale = norm.rms_norm_planes(
            hidden, norm_weight, eps, residual
        )
        logits = self.linear(normed, router_weight, router_bias)
        out = moe.moe_from_logits(normed, x_h, x_unscale, logits, *args[2:])
        return out, new_residual

    @staticmethod
    def _routes_in_experts(moe: ModuleType | None, checks: tuple) -> bool:
        """The norm kernel, the router GEMV and the self-routing expert GEMVs serve this decode
        problem."""
        return moe is not None and moe.routes_in_experts(*checks)


@functools.cache
def _kernel_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"gossamer.kernels.{name}")
    except ImportError as error:
        if error.name != f"gossamer.kernels.{name}":
            raise  # the module exists but is broken: say so rather than silently fall back
        warnings.warn(
            f"gossamer/kernels/{name}.py is missing: TritonOps falls back to the torch reference "
            "for that op (slow, and no CUDA graphs)",
            stacklevel=3,
        )
        return None


def _kernel(module: str, function: str) -> Callable | None:
    """gossamer.kernels.<module>.<function>, or None while that kernel does not exist yet."""
    found = _kernel_module(module)
    return getattr(found, function, None) if found is not None else None
