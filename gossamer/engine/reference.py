"""Single-sequence generation over a contiguous KV cache: the foundation's simple path and the
reference the batching engine is tested against.

The cache is the paged layout with a fixed block table: cache group g owns blocks g*n+1..(g+1)*n
(block 0 is the null block), so no allocator is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.ops.base import AttentionMetadata

BLOCK_SIZE = 16


class ContextTooLongError(ValueError):
    """The prompt plus the tokens to generate do not fit the model's context."""


class ContiguousCache:
    def __init__(self, model: GptOssForCausalLM, max_len: int) -> None:
        if max_len > model.max_model_len:
            raise ContextTooLongError(
                f"{max_len} tokens exceed the model's context of {model.max_model_len}"
            )
        self.max_len = max_len
        blocks_per_group = -(-max_len // BLOCK_SIZE)
        num_groups = model.num_cache_groups
        self.kv_cache = model.allocate_kv_cache(num_groups * blocks_per_group + 1, BLOCK_SIZE)
        first = torch.arange(1, blocks_per_group + 1, dtype=torch.int32, device=model.device)
        self.block_tables = tuple(
            (first + g * blocks_per_group)[None, :] for g in range(num_groups)
        )

    def metadata(self, start: int, num_tokens: int) -> AttentionMetadata:
        end = start + num_tokens
        if end > self.max_len:
            raise ContextTooLongError(f"position {end} is past the cache's {self.max_len} tokens")
        device = self.kv_cache.device
        positions = torch.arange(start, end, device=device)
        slots = tuple(
            table[0, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
            for table in self.block_tables
        )
        return AttentionMetadata(
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=device),
            slot_mapping=slots,
            block_tables=self.block_tables,
            max_query_len=num_tokens,
            max_seq_len=end,
            query_lens_host=(num_tokens,),
            seq_lens_host=(end,),
        )


@torch.inference_mode()
def forward_tokens(
    model: GptOssForCausalLM, cache: ContiguousCache, token_ids: list[int], start: int
) -> torch.Tensor:
    """Feed token_ids at positions start.. and return logits for each of them [n, vocab]."""
    device = model.device
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    positions = torch.arange(start, start + len(token_ids), device=device)
    hidden = model(ids, positions, cache.metadata(start, len(token_ids)), cache.kv_cache)
    return model.compute_logits(hidden)


@dataclass(frozen=True)
class SimpleSampling:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


def sample_token(
    logits: torch.Tensor, params: SimpleSampling, generator: torch.Generator | None
) -> int:
    """One token from logits [vocab]: greedy at temperature 0, else temperature + top-p."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest set whose mass reaches top_p (the top token always stays)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs[outside] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def generate_stream(
    model: GptOssForCausalLM,
    prompt_ids: list[int],
    max_tokens: int,
    params: SimpleSampling = SimpleSampling(),
    stop_token_ids: tuple[int, ...] = (),
) -> Iterator[int]:
    """Yield generated token ids one at a time (stops after a stop token or max_tokens)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    cache = ContiguousCache(model, len(prompt_ids) + max_tokens)
    generator = None
    if params.seed is not None:
        generator = torch.Generator().manual_seed(params.seed)
    logits = forward_tokens(model, cache, prompt_ids, 0)[-1]
    position = len(prompt_ids)
    for step in range(max_tokens):
        token = sample_token(logits, params, generator)
        yield token
        if token in stop_token_ids or step == max_tokens - 1:
            return
        logits = forward_tokens(model, cache, [token], position)[-1]
        position += 1
