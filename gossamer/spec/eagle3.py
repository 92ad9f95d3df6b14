"""EAGLE-3 proposer: one Llama-style decoder layer that drafts from the target's own features.

Checkpoint layout (the published EAGLE-3 heads, e.g. for gpt-oss; architecture
`LlamaForCausalLMEagle3`), optional `model.` prefix, `layers.0.` also accepted for `midlayer.`:

    fc.weight                        [H, 3 * H_target]  aux hidden states (low, middle, high) -> H
    midlayer.input_layernorm.weight  [H]                 RMSNorm of the token embedding
    midlayer.hidden_norm.weight      [H]                 RMSNorm of the projected hidden state
    midlayer.self_attn.{q,k,v}_proj.weight [*, 2H]       attention over cat(embedding, hidden)
    midlayer.self_attn.o_proj.weight [H, heads * D]
    midlayer.post_attention_layernorm.weight, midlayer.mlp.{gate,up,down}_proj.weight (SiLU MLP)
    norm.weight [H], lm_head.weight [draft_vocab, H]
    d2t [draft_vocab] int64          target id = draft id + d2t[draft id]
    t2d [vocab] bool                 (unused)
    embed_tokens.weight [vocab, H]   optional: the target's embedding is used when absent

config.json: the Llama fields, `draft_vocab_size`, `target_hidden_size` (default H),
`norm_before_residual`, and `eagle_config.eagle_aux_hidden_state_layer_ids` (default: target
layers 2, L // 2 and L - 3). An aux hidden state is the residual stream entering that target layer.

Alignment: head position p sees token p + 1 and the target's hidden state at p, and predicts token
p + 2. After each target step the head computes every position whose next token is now known, with
the target's hidden states of that step (`observe`); then it drafts: the last true position gives
draft 0, and each further draft feeds the previous one with the head's own pre-norm output standing
in for the target's hidden state (`propose`). Draft positions are recomputed with the target's
hidden states once verified. Positions whose target hidden states this engine never computed
(prefix-cache hits, blocks shared by n > 1 forks) are computed with zero hidden states: that costs
acceptance, never correctness.

The target runs through `AuxHiddenRunner`, whose captured graphs (plain decodes and padded
verification steps) return the aux states next to the logits. The head has its own small KV pool
(one full-attention layer), without prefix caching; its greedy k-token drafting of a batch replays
one captured graph (`DraftChainGraphs`), random requests and uncaptured shapes draft eagerly.

Tree drafts (a `tree` shape in the config): the head grows the tree one depth at a time
(drafting.grow_trees); a node is fed at the position of its depth with its parent's pre-norm
output as hidden state, and each depth feeds all nodes so far again under a tree mask, as the
draft model does. The target's tree steps replay its tree graphs (runner/model_runner.py, module
doc) where one holds them; after one, `accepted_paths` says which of its rows hold the hidden
states of the accepted tokens.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from gossamer.cache.layout import KVCacheGroupSpec
from gossamer.cache.manager import KVCacheManager
from gossamer.config import ModelConfig, RopeScaling
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.model.rope import cos_sin_table
from gossamer.ops.base import AttentionMetadata, Ops
from gossamer.runner.model_runner import (
    DEFAULT_GRAPH_SIZES,
    MAX_MULTI_TOKEN_GRAPH_SEQS,
    EagerGraphCapture,
    GraphCapture,
    ModelRunner,
    graphs_possible,
)
from gossamer.spec.drafting import draw_drafts, grow_trees, stack_probs
from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest
from gossamer.spec.tree import TreeShape, ancestor_masks

if TYPE_CHECKING:
    from gossamer.engine.core import EngineConfig
    from gossamer.scheduler import SchedulerOutput
    from gossamer.spec.config import SpecConfig

NO_SINK = -1e30  # a sink logit that takes no probability mass: plain softmax attention


class Eagle3Error(ValueError):
    """An EAGLE-3 checkpoint that does not fit the target or cannot be read."""


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    aux_layer_ids: tuple[int, ...] | None = None
    norm_before_residual: bool = False
    attention_bias: bool = False

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> Eagle3Config:
        hidden = raw["hidden_size"]
        heads = raw["num_attention_heads"]
        eagle = raw.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids")
        # transformers v4 spells rope "rope_theta" + "rope_scaling", v5 "rope_parameters"
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or None
        theta = raw.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            target_hidden_size=raw.get("target_hidden_size") or hidden,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=rope,
            aux_layer_ids=tuple(aux) if aux else None,
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
        )

    def aux_layers(self, num_target_layers: int) -> tuple[int, ...]:
        if self.aux_layer_ids is not None:
            layers = tuple(sorted(self.aux_layer_ids))
        else:
            layers = tuple(sorted({2, num_target_layers // 2, num_target_layers - 3}))
        if len(layers) != 3 or not all(0 <= layer < num_target_layers for layer in layers):
            raise Eagle3Error(
                f"EAGLE-3 needs three distinct target layers in 0..{num_target_layers - 1}, got "
                f"{layers}; set eagle_config.eagle_aux_hidden_state_layer_ids in its config.json"
            )
        return layers


def _weight(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _linear_module(out_features: int, in_features: int, bias: bool, dtype: torch.dtype):
    module = nn.Module()
    module.weight = _weight(out_features, in_features, dtype=dtype)
    module.bias = _weight(out_features, dtype=dtype) if bias else None
    return module


def _norm_module(size: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    # NOTE: norm weights stay float32, as in the target (the norm op computes in float32)
    module = nn.Module()
    module.weight = _weight(size, dtype=dtype)
    return module


class Eagle3Head(nn.Module):
    """The EAGLE-3 draft head; parameter names are the checkpoint's."""

    def __init__(
        self,
        config: Eagle3Config,
        ops: Ops,
        *,
        dtype: torch.dtype,
        max_positions: int,
        own_embedding: bool,
    ) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.max_positions = max_positions
        hidden, heads, kv_heads = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
        )
        head_dim, bias = config.head_dim, config.attention_bias
        self.fc = _linear_module(hidden, 3 * config.target_hidden_size, False, dtype)
        layer = self.midlayer = nn.Module()
        layer.input_layernorm = _norm_module(hidden)
        layer.hidden_norm = _norm_module(hidden)
        layer.post_attention_layernorm = _norm_module(hidden)
        attn = layer.self_attn = nn.Module()
        attn.q_proj = _linear_module(heads * head_dim, 2 * hidden, bias, dtype)
        attn.k_proj = _linear_module(kv_heads * head_dim, 2 * hidden, bias, dtype)
        attn.v_proj = _linear_module(kv_heads * head_dim, 2 * hidden, bias, dtype)
        attn.o_proj = _linear_module(hidden, heads * head_dim, bias, dtype)
        mlp = layer.mlp = nn.Module()
        mlp.gate_proj = _linear_module(config.intermediate_size, hidden, False, dtype)
        mlp.up_proj = _linear_module(config.intermediate_size, hidden, False, dtype)
        mlp.down_proj = _linear_module(hidden, config.intermediate_size, False, dtype)
        self.norm = _norm_module(hidden)
        self.lm_head = _linear_module(config.draft_vocab_size, hidden, False, dtype)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.embed_tokens = nn.Module()  # its weight: below, or the target's
        self.embed_tokens.weight = (
            _weight(config.vocab_size, hidden, dtype=dtype) if own_embedding else None
        )
        self.register_buffer("sinks", torch.full((heads,), NO_SINK, dtype=torch.float32))
        self.cos_sin: torch.Tensor | None = None
        self._target_ids: torch.Tensor | tuple | None = None  # draft id -> target id, () = same

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def share_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's token embedding (checkpoints usually leave theirs out)."""
        self.embed_tokens.weight = nn.Parameter(weight, requires_grad=False)

    def rope_table(self) -> torch.Tensor:
        if self.cos_sin is None or self.cos_sin.device != self.device:
            self.cos_sin = llama_cos_sin_table(self.config, self.max_positions, self.device)
        return self.cos_sin

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        hidden: torch.Tensor,  # [T, 3 * H_target] target aux states, or [T, H] own pre-norm
        metadata: AttentionMetadata,
        kv_cache: torch.Tensor,  # [1, 2, blocks, block_size, kv_heads, head_dim]
        from_target: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (normed hidden [T, H] for the LM head, pre-norm hidden [T, H] for the next
        draft step). `from_target`: `hidden` holds the target's aux states (projected by fc),
        else the head's own pre-norm output of the previous position."""
        ops, cfg, layer = self.ops, self.config, self.midlayer
        embeds = self.embed_tokens.weight[input_ids]
        if from_target:
            hidden = ops.linear(hidden.to(self.fc.weight.dtype), self.fc.weight, None)
        eps = cfg.rms_norm_eps
        embeds, _ = ops.rms_norm(embeds, layer.input_layernorm.weight, eps)
        normed_hidden, _ = ops.rms_norm(hidden, layer.hidden_norm.weight, eps)
        residual = normed_hidden if cfg.norm_before_residual else hidden
        x = self._attention(
            torch.cat((embeds, normed_hidden), dim=-1), positions, metadata, kv_cache
        )
        x, residual = ops.rms_norm(x, layer.post_attention_layernorm.weight, eps, residual)
        mlp = layer.mlp
        gate = ops.linear(x, mlp.gate_proj.weight, None)
        up = ops.linear(x, mlp.up_proj.weight, None)
        x = ops.linear(nn.functional.silu(gate) * up, mlp.down_proj.weight, None)
        return ops.rms_norm(x, self.norm.weight, eps, residual)

    def _attention(
        self,
        x: torch.Tensor,  # [T, 2H]
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        ops, cfg, attn = self.ops, self.config, self.midlayer.self_attn
        q = ops.linear(x, attn.q_proj.weight, attn.q_proj.bias)
        k = ops.linear(x, attn.k_proj.weight, attn.k_proj.bias)
        v = ops.linear(x, attn.v_proj.weight, attn.v_proj.bias)
        q = q.view(-1, cfg.num_attention_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_key_value_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_key_value_heads, cfg.head_dim)
        layer_cache = kv_cache[0]
        q = ops.rope_and_write_kv(
            q, k, v, positions, self.rope_table(), layer_cache, metadata.slot_mapping[0]
        )
        out = ops.attention(q, layer_cache, metadata, 0, self.sinks, cfg.head_dim**-0.5, None)
        return ops.linear(out.flatten(1), attn.o_proj.weight, attn.o_proj.bias)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, vocab] float32 in the target vocabulary; tokens outside the draft
        vocabulary get -inf."""
        draft_logits = self.ops.linear(hidden, self.lm_head.weight, None).float()
        if self._target_ids is None:
            identity = self.config.draft_vocab_size == self.config.vocab_size
            self._target_ids = () if identity and not self.d2t.any() else self.draft_to_target()
        if isinstance(self._target_ids, tuple):
            return draft_logits
        full = draft_logits.new_full((hidden.shape[0], self.config.vocab_size), float("-inf"))
        # NOTE: index_copy_, not indexed assignment: it runs inside captured drafting graphs
        return full.index_copy_(1, self._target_ids, draft_logits)

    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab] target token id of each draft token id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        cfg = self.config
        shape = (1, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        return torch.zeros(shape, dtype=self.lm_head.weight.dtype, device=self.device)


def llama_cos_sin_table(
    config: Eagle3Config, max_positions: int, device: torch.device | str
) -> torch.Tensor:
    """[max_positions, head_dim] cos | sin for Llama rope: plain, "llama3" or "yarn" scaling."""
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "yarn":
        rope = RopeScaling(
            factor=float(scaling.get("factor", 1.0)),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            beta_fast=float(scaling.get("beta_fast") or 32.0),
            beta_slow=float(scaling.get("beta_slow") or 1.0),
            truncate=bool(scaling.get("truncate", True)),
        )
        like = ModelConfig(
            head_dim=config.head_dim, rope_theta=config.rope_theta, rope_scaling=rope
        )
        return cos_sin_table(like, max_positions, device)
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if rope_type == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    elif rope_type not in ("default", "linear"):
        raise Eagle3Error(f"EAGLE-3 rope_scaling type {rope_type!r} is not supported")
    elif rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device)


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    long_wave = wavelength > original / low
    short_wave = wavelength < original / high
    return torch.where(long_wave, inv_freq / factor, torch.where(short_wave, inv_freq, blended))


# ---- loading ------------------------------------------------------------------------------------


def load_eagle3_head(
    path: str | Path,
    target: GptOssForCausalLM,
    *,
    dtype: torch.dtype | None = None,
) -> Eagle3Head:
    folder = Path(path)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise Eagle3Error(f"no config.json in the EAGLE-3 checkpoint folder {folder}")
    config = Eagle3Config.from_hf(json.loads(config_path.read_text()))
    if config.vocab_size != target.config.vocab_size:
        raise Eagle3Error(
            f"the EAGLE-3 head is for a vocabulary of {config.vocab_size} tokens, the target has "
            f"{target.config.vocab_size}"
        )
    if config.target_hidden_size != target.config.hidden_size:
        raise Eagle3Error(
            f"the EAGLE-3 head expects target hidden size {config.target_hidden_size}, the target "
            f"has {target.config.hidden_size}"
        )
    tensors = _read_tensors(folder)
    own_embedding = "embed_tokens.weight" in tensors
    if not own_embedding and config.hidden_size != target.config.hidden_size:
        raise Eagle3Error("the EAGLE-3 checkpoint has no embed_tokens and a different hidden size")
    dtype = dtype or target.dtype
    with torch.device(target.device):
        head = Eagle3Head(
            config,
            target.ops,
            dtype=dtype,
            max_positions=target.max_model_len,
            own_embedding=own_embedding,
        )
    if not own_embedding:
        head.share_embedding(target.model.embed_tokens.weight)
    _copy_into(head, tensors, folder)
    return head


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    raw: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for file in files:
            raw.update(load_file(file))
    elif (folder / "pytorch_model.bin").is_file():
        raw = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise Eagle3Error(f"no *.safetensors or pytorch_model.bin in {folder}")
    tensors = {}
    for name, tensor in raw.items():
        name = name.removeprefix("model.").replace("layers.0.", "midlayer.")
        if name != "t2d":
            tensors[name] = tensor
    return tensors


def _copy_into(head: Eagle3Head, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    params = dict(head.named_parameters()) | dict(head.named_buffers())
    params.pop("sinks")
    if "embed_tokens.weight" not in tensors:
        params.pop("embed_tokens.weight", None)
    if "d2t" not in tensors:
        if head.config.draft_vocab_size != head.config.vocab_size:
            raise Eagle3Error(f"{folder} has a reduced draft vocabulary but no d2t mapping")
        params.pop("d2t")
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing or unexpected:
        raise Eagle3Error(
            f"EAGLE-3 checkpoint {folder}: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    with torch.no_grad():
        for name, target in params.items():
            source = tensors[name]
            if tuple(source.shape) != tuple(target.shape):
                raise Eagle3Error(
                    f"{folder}: {name} has shape {tuple(source.shape)}, expected "
                    f"{tuple(target.shape)}"
                )
            target.copy_(source.to(target.dtype))


# ---- the target side -----------------------------------------------------------------------------


class AuxHiddenRunner(ModelRunner):
    """A ModelRunner whose steps also keep, for every token fed, the residual stream entering the
    EAGLE-3 layers: `last_aux_hidden` [num_tokens, 3 * hidden], in the order of the sequences.
    Eager steps and graph replays alike: a captured graph writes them into its persistent
    outputs next to the logits (ModelRunner's `_forward` extras)."""

    def __init__(self, *args, aux_layers: tuple[int, ...], **kwargs) -> None:
        self.aux_layers = aux_layers  # before ModelRunner.__init__, which may capture graphs
        super().__init__(*args, **kwargs)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        hidden, aux = self.model(
            input_ids, positions, metadata, self.kv_cache, aux_layers=self.aux_layers,
            **self.fed_kwargs(),
        )  # fmt: skip
        return hidden, (torch.cat(aux, dim=-1),)

    @property
    def last_aux_hidden(self) -> torch.Tensor | None:
        return self.last_extras[0] if self.last_extras else None


# ---- the proposer --------------------------------------------------------------------------------


@dataclass(eq=False)
class _HeadSequence:
    """A request in the head's cache (the `CacheRequest` the manager reads). Positions below
    num_computed_tokens hold KV computed from true tokens and target hidden states."""

    request_id: str
    num_computed_tokens: int = 0
    all_token_ids: list[int] = field(default_factory=list)  # unused: prefix caching is off
    cache_salt: str | None = None
    block_hashes: list[int] = field(default_factory=list)


@dataclass
class _Chain:
    """A request the head drafts for this step."""

    index: int  # in the propose() batch
    request: SpecRequest
    sequence: _HeadSequence
    count: int  # drafts wanted

    @property
    def first_draft_position(self) -> int:
        """The head position that draft 0 is fed at (the position of the request's last token,
        which the target has not computed yet)."""
        return len(self.request.token_ids) - 1


@dataclass
class _Feed:
    sequence: _HeadSequence
    start: int  # first position
    token_ids: list[int]  # token p + 1 for each position p
    hidden: torch.Tensor  # [n, 3 * H_target] (zeros where the target computed nothing)
    ready: bool  # the last position is the request's last true one: it yields draft 0


class Eagle3Proposer(BaseProposer):
    name = "eagle3"

    def __init__(
        self,
        head: Eagle3Head,
        target: GptOssForCausalLM,
        *,
        num_speculative_tokens: int,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        tree: TreeShape | None = None,
    ) -> None:
        self.head = head
        self.aux_layers = head.config.aux_layers(target.config.num_hidden_layers)
        self.num_speculative_tokens = num_speculative_tokens
        self.tree = tree
        # head cache slots past the true positions that drafting writes
        self.num_draft_slots = tree.num_nodes if tree is not None else num_speculative_tokens
        self.block_size = block_size
        self.manager = KVCacheManager(
            [KVCacheGroupSpec((0,))], num_blocks, block_size=block_size, enable_prefix_caching=False
        )
        self.kv_cache = head.allocate_kv_cache(num_blocks, block_size)
        self.shared_generator = torch.Generator().manual_seed(seed)
        self.target_runner: AuxHiddenRunner | None = None
        self._sequences: dict[str, _HeadSequence] = {}
        # request id -> (position, normed [H], pre-norm [H]) of its last true position
        self._ready: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.chain_graphs: DraftChainGraphs | None = None  # see capture_graphs
        self.draft_modes: Counter[str] = Counter()  # propose() batches drafted by graph / eager
        self._paths: dict[str, list[int]] = {}  # the last tree step's accepted nodes

    @classmethod
    def load(
        cls,
        config: SpecConfig,
        target: GptOssForCausalLM,
        engine_config: EngineConfig,
        num_blocks: int,
    ) -> Eagle3Proposer:
        head = load_eagle3_head(config.model, target)
        proposer = cls(
            head,
            target,
            num_speculative_tokens=config.num_speculative_tokens,
            num_blocks=config.draft_num_blocks or num_blocks,
            block_size=engine_config.block_size,
            seed=engine_config.seed + 1,
            tree=config.tree,
        )
        if config.tree is None and graphs_possible(head, engine_config.cuda_graphs):
            # the batch sizes the target has verification graphs for (larger steps run eagerly)
            limit = min(engine_config.max_num_seqs, MAX_MULTI_TOKEN_GRAPH_SEQS)
            sizes = [size for size in DEFAULT_GRAPH_SIZES if size <= limit]
            proposer.capture_graphs(sizes, config.draft_len_ladder)
        return proposer

    def target_runner_class(self):
        """A ModelRunner factory for the engine: the runner it builds reports to this proposer."""

        def build(*args, **kwargs) -> AuxHiddenRunner:
            if self.tree is not None:  # its verification steps replay tree graphs
                kwargs.setdefault("tree_query_len", 1 + self.tree.num_nodes)
            runner = AuxHiddenRunner(*args, aux_layers=self.aux_layers, **kwargs)
            self.target_runner = runner
            return runner

        return build

    # ---- after every target step -------------------------------------------------------------

    def accepted_paths(self, paths: dict[str, list[int]]) -> None:
        self._paths = paths

    @torch.inference_mode()
    def observe(self, scheduled: SchedulerOutput, live: dict[str, list[int]]) -> None:
        self._ready.clear()
        paths, self._paths = self._paths, {}
        if not scheduled.scheduled_requests:
            return
        aux = self.target_runner.last_aux_hidden if self.target_runner is not None else None
        if aux is None:
            raise Eagle3Error(
                "EAGLE-3 needs the target's hidden states: build the engine without a custom "
                "runner so that it runs the target through AuxHiddenRunner"
            )
        feeds, offset = [], 0
        for item in scheduled.scheduled_requests:
            rows = (offset, offset + item.num_new_tokens)
            offset += item.num_new_tokens
            tokens = live.get(item.request_id)
            if tokens is not None:
                path = paths.get(item.request_id)
                feed = self._feed(item.request_id, item.start_position, rows, tokens, aux, path)
                if feed is not None:
                    feeds.append(feed)
        if feeds:
            self._run_feeds(feeds)

    def _feed(
        self,
        request_id: str,
        start: int,
        rows: tuple[int, int],
        tokens: list[int],
        aux: torch.Tensor,  # [step tokens, 3 * H_target]
        path: list[int] | None = None,  # after a tree step: its accepted nodes
    ) -> _Feed | None:
        """The head positions this step makes computable for one request."""
        sequence = self._sequences.get(request_id)
        if sequence is None:
            sequence = self._sequences[request_id] = _HeadSequence(request_id)
        # the target now holds true KV below `end`; position end - 1's next token is known
        end = min(start + rows[1] - rows[0], len(tokens) - 1)
        first = sequence.num_computed_tokens
        if end <= first:
            return None
        room = end - first + self.num_draft_slots
        if not self.manager.allocate_slots(sequence, room):
            self._drop(request_id)
            return None
        hidden = aux.new_zeros(end - first, aux.shape[-1])
        lo = max(first, start)  # positions before `start` have no target hidden states here
        if lo < end and path is not None:  # the step fed accepted token j + 1 as node path[j]
            fed = [0, *(1 + node for node in path)][lo - start : end - start]
            hidden[lo - first :] = aux[torch.tensor(fed, device=aux.device) + rows[0]]
        elif lo < end:
            hidden[lo - first :] = aux[rows[0] + lo - start : rows[0] + end - start]
        ready = end == len(tokens) - 1
        return _Feed(sequence, first, tokens[first + 1 : end + 1], hidden, ready)

    def _run_feeds(self, feeds: list[_Feed]) -> None:
        spans = [(feed.sequence, feed.start, len(feed.token_ids)) for feed in feeds]
        token_ids = [token for feed in feeds for token in feed.token_ids]
        hidden = torch.cat([feed.hidden for feed in feeds])
        normed, prenorm = self._forward(spans, token_ids, hidden)
        end = 0
        for feed in feeds:
            end += len(feed.token_ids)
            feed.sequence.num_computed_tokens = feed.start + len(feed.token_ids)
            if feed.ready:
                position = feed.sequence.num_computed_tokens - 1
                self._ready[feed.sequence.request_id] = (
                    position,
                    normed[end - 1],
                    prenorm[end - 1],
                )

    def _forward(
        self,
        spans: list[tuple[_HeadSequence, int, int]],  # (sequence, first position, count)
        token_ids: list[int],
        hidden: torch.Tensor,
        from_target: bool = True,
        tree_masks: list[tuple[int, ...]] | None = None,  # per span: its tokens' (tree drafts)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.head.device
        positions = np.concatenate([np.arange(start, start + n) for _, start, n in spans])
        if tree_masks is not None:  # a tree node sits at its depth
            depths = [mask.bit_count() - 1 for masks in tree_masks for mask in masks]
            starts = [start for _, start, n in spans for _ in range(n)]
            positions = np.add(starts, depths)
        tables = [self.manager.block_tables(seq.request_id)[0] for seq, _, _ in spans]
        metadata = paged_metadata(
            [(start, n, table) for (_, start, n), table in zip(spans, tables, strict=True)],
            self.block_size,
            device,
            tree_masks,
        )
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        positions_tensor = torch.from_numpy(positions).to(device)
        return self.head(ids, positions_tensor, hidden, metadata, self.kv_cache, from_target)

    # ---- drafting ----------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        drafts: list[Draft | None] = [None] * len(requests)
        chains = self._chains(requests)
        if not chains:
            return drafts
        if self.tree is not None:
            for chain, tokens in zip(chains, self._draft_trees(chains), strict=True):
                drafts[chain.index] = Draft(tokens, None, list(self.tree.parents[: len(tokens)]))
            return drafts
        drafted = self._draft_replayed(chains)
        if drafted is None:
            drafted = self._draft_eager(chains)
        for chain, (tokens, probs) in zip(chains, drafted, strict=True):
            drafts[chain.index] = Draft(tokens, stack_probs(probs))
        return drafts

    def _chains(self, requests: Sequence[SpecRequest]) -> list[_Chain]:
        """The requests the head can draft for: those whose last true position it computed in
        the latest `observe`."""
        chains = []
        for index, request in enumerate(requests):
            ready = self._ready.get(request.request_id)
            sequence = self._sequences.get(request.request_id)
            if ready is None or sequence is None or ready[0] != len(request.token_ids) - 2:
                continue
            count = min(self.num_speculative_tokens, request.max_draft_tokens)
            chains.append(_Chain(index, request, sequence, count))
        return chains

    def _draft_eager(self, chains: list[_Chain]) -> list[tuple[list[int], list]]:
        """(draft tokens, the distribution of each) per chain, one head step at a time for the
        chains that still want drafts; random requests draw with their own generators."""
        normed = torch.stack([self._ready[c.request.request_id][1] for c in chains])
        prenorm = torch.stack([self._ready[c.request.request_id][2] for c in chains])
        tokens_out: list[tuple[list[int], list]] = [([], []) for _ in chains]
        active = list(range(len(chains)))
        step = 0
        while True:
            logits = self.head.compute_logits(normed)
            rows = [chains[i].request.row for i in active]
            tokens, probs = draw_drafts(logits, rows, self.shared_generator)
            for i, token, q in zip(active, tokens, probs, strict=True):
                tokens_out[i][0].append(token)
                tokens_out[i][1].append(q)
            keep = [j for j, i in enumerate(active) if len(tokens_out[i][0]) < chains[i].count]
            if not keep:
                break
            active = [active[j] for j in keep]
            # position of the new draft's input: the request's last true position + 1 + step
            spans = [(chains[i].sequence, chains[i].first_draft_position + step, 1) for i in active]
            normed, prenorm = self._forward(
                spans, [tokens_out[i][0][-1] for i in active], prenorm[keep], from_target=False
            )
            step += 1
        self.draft_modes["eager"] += 1
        return tokens_out

    def _draft_trees(self, chains: list[_Chain]) -> list[list[int]]:
        """Top-k tree drafts, one head pass per depth (see the module doc)."""
        tree = self.tree
        ready = [self._ready[chain.request.request_id] for chain in chains]
        # per chain: the head's pre-norm output after each node (the hidden input of its children)
        node_prenorm: list[list[torch.Tensor]] = [[] for _ in chains]

        def parent_prenorm(r: int, parent: int) -> torch.Tensor:
            return ready[r][2] if parent < 0 else node_prenorm[r][parent]

        def score(deeper: list[int], tokens: list[list[int]]) -> torch.Tensor:
            spans, token_ids, hidden, masks = [], [], [], []
            for r in deeper:
                parents = tree.parents[: len(tokens[r])]
                spans.append((chains[r].sequence, chains[r].first_draft_position, len(parents)))
                token_ids += tokens[r]
                hidden += [parent_prenorm(r, parent) for parent in parents]
                masks.append(ancestor_masks(parents, with_root=False))
            normed, prenorm = self._forward(
                spans, token_ids, torch.stack(hidden), from_target=False, tree_masks=masks
            )
            newest, offset = [], 0  # rows of the deepest nodes so far, whose children come next
            for r in deeper:
                count = len(tokens[r])
                for node in tree.level(tree.depths[count - 1], count):
                    node_prenorm[r].append(prenorm[offset + node])
                    newest.append(offset + node)
                offset += count
            return self.head.compute_logits(normed[newest])

        sizes = [tree.num_nodes_within(chain.count) for chain in chains]
        root_logits = self.head.compute_logits(torch.stack([entry[1] for entry in ready]))
        self.draft_modes["eager"] += 1
        return grow_trees(tree, sizes, root_logits, score)

    def _draft_replayed(self, chains: list[_Chain]) -> list[tuple[list[int], list]] | None:
        """The drafts from a captured chain graph, or None when none fits: no graphs, a batch or
        draft count larger than captured, or a random request (its draws come from its own CPU
        generator, between head steps: see DraftChainGraphs)."""
        graphs = self.chain_graphs
        if graphs is None or not all(chain.request.row.params.greedy for chain in chains):
            return None
        key = graphs.key_for(len(chains), max(chain.count for chain in chains))
        if key is None:
            return None
        inputs = [
            ChainInput(
                *self._ready[chain.request.request_id][1:],
                chain.first_draft_position,
                chain.count,
                self.manager.block_tables(chain.request.request_id)[0],
            )
            for chain in chains
        ]
        tokens = graphs.replay(key, inputs)
        self.draft_modes["graph"] += 1
        return [
            (row[: chain.count], [None] * chain.count)
            for row, chain in zip(tokens, chains, strict=True)
        ]

    def capture_graphs(
        self,
        sizes: Sequence[int],
        draft_lens: Sequence[int],
        capture: GraphCapture | EagerGraphCapture | None = None,
    ) -> None:
        """Capture the greedy drafting of `k` tokens for each batch size and k of `draft_lens`
        (at most num_speculative_tokens). `capture`: EagerGraphCapture() on the CPU (tests)."""
        draft_lens = [k for k in draft_lens if k <= self.num_speculative_tokens]
        self.chain_graphs = DraftChainGraphs(
            self.head, self.kv_cache, self.block_size, max(sizes), max(draft_lens)
        )
        self.chain_graphs.capture(sizes, draft_lens, capture or GraphCapture())

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _drop(self, request_id: str) -> None:
        self.manager.free(request_id)
        self._sequences.pop(request_id, None)
        self._ready.pop(request_id, None)

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._drop(request_id)


def paged_metadata(
    spans: list[tuple[int, int, Sequence[int]]],  # (first position, count, block table)
    block_size: int,
    device: torch.device,
    tree_masks: list[tuple[int, ...]] | None = None,  # per span, AttentionMetadata.tree_mask's
) -> AttentionMetadata:
    """Attention metadata of one full-attention cache group for sequences that feed `count`
    tokens from `first slot position` (their earlier positions already hold KV)."""
    query_start, seq_lens, slots = [0], [], []
    width = max(len(table) for _, _, table in spans)
    tables = np.zeros((len(spans), width), dtype=np.int32)
    for i, (start, count, table) in enumerate(spans):
        table_array = np.asarray(table, dtype=np.int64)
        positions = np.arange(start, start + count)
        slots.append(table_array[positions // block_size] * block_size + positions % block_size)
        tables[i, : len(table)] = table
        query_start.append(query_start[-1] + count)
        seq_lens.append(start + count)
    tree_mask, tree_mask_host = None, ()
    if tree_masks is not None:
        tree_mask_host = tuple(mask for masks in tree_masks for mask in masks)
        tree_mask = torch.tensor(tree_mask_host, dtype=torch.int64, device=device)
    return AttentionMetadata(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        slot_mapping=(torch.from_numpy(np.concatenate(slots)).to(device),),
        block_tables=(torch.from_numpy(tables).to(device),),
        max_query_len=max(count for _, count, _ in spans),
        max_seq_len=max(seq_lens),
        query_lens_host=tuple(count for _, count, _ in spans),
        seq_lens_host=tuple(seq_lens),
        tree_mask=tree_mask,
        tree_mask_host=tree_mask_host,
    )


# ---- captured greedy drafting --------------------------------------------------------------------


@dataclass
class ChainInput:
    """One chain's inputs to a captured drafting graph."""

    normed: torch.Tensor  # [H] the head's output at the last true position: draft 0's logits
    prenorm: torch.Tensor  # [H] its pre-norm state: the hidden input of head step 1
    first_position: int  # the head position draft 0 is fed at
    count: int  # drafts wanted (<= the graph's k)
    block_table: Sequence[int]  # the head cache's


class DraftChainGraphs:
    """Greedy k-token drafting of a batch of chains, one captured graph per (batch size, k).

    A graph computes draft 0 from the head's state at each chain's last true position, then runs
    head steps 1 .. k-1, each feeding the previous step's argmax (kept on the device) at the next
    position with the previous pre-norm state; the draft ids [batch, k] come back in one copy.
    The positions, context lengths, KV slots and block tables of every step sit in persistent
    buffers the host fills before a replay. Rows past the real chains (batch padding) and the
    steps past a chain's own count write no KV (slot -1) and attend to true positions only;
    their drafts are dropped.

    Why whole chains and greedy only: a chain of k head steps is k - 1 small layers whose eager
    launches cost more than their work, and capturing all of them saves k - 1 host round trips
    as well. Random requests draw each draft with their own CPU generator (so that a seeded
    request's drafts do not depend on its batch) and must hand on the distribution, which a graph
    cannot do between its steps; their batches draft eagerly."""

    def __init__(
        self,
        head: Eagle3Head,
        kv_cache: torch.Tensor,
        block_size: int,
        max_batch: int,
        max_draft_len: int,
    ) -> None:
        self.head, self.kv_cache, self.block_size = head, kv_cache, block_size
        device, hidden = head.device, head.config.hidden_size
        self.normed = torch.zeros(max_batch, hidden, dtype=head.lm_head.weight.dtype, device=device)
        self.prenorm = torch.zeros_like(self.normed)
        steps, width = max(max_draft_len - 1, 1), -(-head.max_positions // block_size)
        # per head step 1 .. k-1 (row step - 1) and chain; block tables per chain
        self.host = {
            "positions": np.zeros((steps, max_batch), dtype=np.int64),
            "seq_lens": np.ones((steps, max_batch), dtype=np.int32),
            "slot_mapping": np.full((steps, max_batch), -1, dtype=np.int64),
            "block_tables": np.zeros((max_batch, width), dtype=np.int32),
        }
        self.dev = {name: torch.from_numpy(a).to(device) for name, a in self.host.items()}
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # [batch, k] draft ids

    def capture(
        self, sizes: Sequence[int], draft_lens: Sequence[int], capture: GraphCapture
    ) -> None:
        """Largest first, so that the graphs share one memory pool."""
        keys = sorted(((b, k) for b in sizes for k in draft_lens), key=lambda key: -key[0] * key[1])
        for size, k in keys:
            self._fill(size, [])
            graph, (tokens,) = capture.capture(partial(self._chain, size, k))
            self.graphs[(size, k)], self.outputs[(size, k)] = graph, tokens
        capture.finish()

    def key_for(self, num_chains: int, longest: int) -> tuple[int, int] | None:
        """The smallest captured (batch size, k) that holds the chains."""
        fitting = [(k, b) for b, k in self.graphs if b >= num_chains and k >= longest]
        return (min(fitting)[1], min(fitting)[0]) if fitting else None

    def replay(self, key: tuple[int, int], chains: list[ChainInput]) -> list[list[int]]:
        """Draft ids [len(chains)][k]; a chain's ids past its count are meaningless."""
        self._fill(key[0], chains)
        self.graphs[key].replay()
        return self.outputs[key][: len(chains)].tolist()

    def _fill(self, size: int, chains: list[ChainInput]) -> None:
        host, dev = self.host, self.dev
        host["positions"][:, :size] = 0  # padding rows (real chains: _fill_chain)
        host["seq_lens"][:, :size] = 1
        host["slot_mapping"][:, :size] = -1
        host["block_tables"][:size, 0] = 0  # the null block
        width = 1  # the block-table columns this replay reads
        for row, chain in enumerate(chains):
            width = max(width, self._fill_chain(row, chain))
        for name in ("positions", "seq_lens", "slot_mapping"):
            dev[name][:, :size].copy_(torch.from_numpy(host[name][:, :size]))
        dev["block_tables"][:size, :width].copy_(
            torch.from_numpy(host["block_tables"][:size, :width])
        )
        n = len(chains)
        if n:
            self.normed[:n].copy_(torch.stack([chain.normed for chain in chains]))
            self.prenorm[:n].copy_(torch.stack([chain.prenorm for chain in chains]))
        self.normed[n:size].zero_()
        self.prenorm[n:size].zero_()

    def _fill_chain(self, row: int, chain: ChainInput) -> int:
        """Writes one chain's row; returns the block-table columns it uses."""
        host, bs = self.host, self.block_size
        table = np.asarray(chain.block_table[: host["block_tables"].shape[1]], dtype=np.int32)
        host["block_tables"][row, : len(table)] = table
        for step in range(1, host["positions"].shape[0] + 1):
            if step < chain.count:  # draft step - 1 is fed at the next position
                position = chain.first_position + step - 1
                slot = int(table[position // bs]) * bs + position % bs
            else:  # not wanted: attend to the true positions, write nothing
                position, slot = chain.first_position - 1, -1
            host["positions"][step - 1, row] = position
            host["seq_lens"][step - 1, row] = position + 1
            host["slot_mapping"][step - 1, row] = slot
        return len(table)

    def _chain(self, size: int, k: int) -> tuple[torch.Tensor]:
        """What a graph captures: k greedy drafts for `size` rows, [size, k]."""
        head, dev = self.head, self.dev
        normed, prenorm = self.normed[:size], self.prenorm[:size]
        drafts: list[torch.Tensor] = []
        for step in range(k):
            if step:
                metadata = AttentionMetadata(
                    query_start_loc=self.query_start_loc[: size + 1],
                    seq_lens=dev["seq_lens"][step - 1, :size],
                    slot_mapping=(dev["slot_mapping"][step - 1, :size],),
                    block_tables=(dev["block_tables"][:size],),
                    max_query_len=1,
                    # NOTE: attention sizes its split-K grid from max_seq_len: the bound keeps
                    # one graph valid for every context length
                    max_seq_len=head.max_positions,
                )
                positions = dev["positions"][step - 1, :size]
                normed, prenorm = head(
                    drafts[-1], positions, prenorm, metadata, self.kv_cache, from_target=False
                )
            drafts.append(head.compute_logits(normed).argmax(dim=-1))
        return (torch.stack(drafts, dim=1),)
