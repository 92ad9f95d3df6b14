"""Turns logits into tokens: penalties, min_tokens, temperature, top-k/top-p/min-p, seeds, logprobs.

Order (the one vLLM and the OpenAI API document): penalties on the raw logits, stop tokens masked
until min_tokens, then greedy argmax or temperature -> top-k -> top-p -> min-p -> a random draw.
Logprobs report the model's own distribution (raw logits), not the processed one.

Random draws use the "exponential race": argmax(p / E) with E ~ Exp(1) picks token i with probability
p_i. Each seeded request draws E from its own generator, so its tokens do not depend on which other
requests share the batch.

Host-built tensors (row indices, per-row parameters, the CPU-drawn noise) reach the device through
pinned non-blocking copies, so sampling on the device (engine/overlap.py) never waits for the
stream; `Sampler.sample` still ends with the tokens' trip to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gossamer.runner.host_copy import to_device
from gossamer.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one request for one draw."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None  # the request's own when it has a seed
    min_tokens_stop_ids: tuple[int, ...] = ()  # eos + stop_token_ids, banned before min_tokens


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the N most likely tokens, most likely first


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.shared_generator = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleResult:
        """logits [N, vocab] (any float dtype, any device) -> one token per row."""
        raw = logits.float()
        processed = adjust_logits(raw, rows)
        tokens = processed.argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
        if random_rows:
            index = to_device(random_rows, processed.device)
            drawn = self._draw(processed[index], [rows[i] for i in random_rows])
            tokens[index] = drawn
        token_list = tokens.tolist()
        return SampleResult(token_list, token_logprobs(raw, token_list, rows))

    def _draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        probs = filtered_probs(logits, rows)
        generators = [row.generator or self.shared_generator for row in rows]
        noise = exponential_noise_rows(probs.shape[-1], generators, probs.device)
        return (probs / noise).argmax(dim=-1)


def adjust_logits(raw: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Penalties and the min_tokens ban applied to raw logits [N, vocab] (a copy only when some
    row needs one)."""
    adjust = [i for i, row in enumerate(rows) if _needs_adjusting(row)]
    if not adjust:
        return raw
    processed = raw.clone()
    for i in adjust:
        _apply_penalties(processed[i], rows[i])
        _ban_stop_tokens_before_min(processed[i], rows[i])
    return processed


def filtered_probs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Temperature softmax, then top-k / top-p / min-p: unnormalised probabilities [N, vocab]."""
    temperatures = [r.params.temperature for r in rows]
    temperature = to_device(temperatures, logits.device, torch.float32)
    return filter_probs(torch.softmax(logits / temperature[:, None], dim=-1), rows)


def exponential_noise(size: int, generator: torch.Generator) -> torch.Tensor:
    """Exp(1) draws for the exponential race, from the request's own generator."""
    return torch.empty(size).exponential_(generator=generator)


def exponential_noise_rows(
    size: int, generators: Sequence[torch.Generator], device: torch.device
) -> torch.Tensor:
    """[len(generators), size] Exp(1) draws on `device`, row i from generators[i] (the draws of
    `exponential_noise`), drawn on the host into pinned memory and copied without blocking."""
    host = torch.empty(len(generators), size, pin_memory=device.type == "cuda")
    for row, generator in zip(host, generators, strict=True):
        row.exponential_(generator=generator)
    return host.to(device, non_blocking=True)


def _needs_adjusting(row: SamplingRow) -> bool:
    params = row.params
    return params.uses_penalties or len(row.output_token_ids) < params.min_tokens


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> None:
    params = row.params
    if not params.uses_penalties:
        return
    vocab = logits.shape[-1]
    output = torch.tensor(row.output_token_ids, dtype=torch.long, device=logits.device)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(
            list(row.prompt_token_ids) + list(row.output_token_ids),
            dtype=torch.long,
            device=logits.device,
        ).unique()
        values = logits[seen]
        penalty = params.repetition_penalty
        logits[seen] = torch.where(values > 0, values / penalty, values * penalty)
    if output.numel():
        counts = torch.bincount(output, minlength=vocab)[:vocab].to(logits.dtype)
        logits -= params.frequency_penalty * counts
        logits -= params.presence_penalty * (counts > 0).to(logits.dtype)


def _ban_stop_tokens_before_min(logits: torch.Tensor, row: SamplingRow) -> None:
    if len(row.output_token_ids) < row.params.min_tokens and row.min_tokens_stop_ids:
        ids = [t for t in row.min_tokens_stop_ids if t < logits.shape[-1]]
        logits[ids] = float("-inf")


def filter_probs(probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Zero the tokens outside each row's top-k / top-p / min-p set (renormalising is not needed
    for an argmax race)."""
    top_k = [r.params.top_k if r.params.top_k > 0 else probs.shape[-1] for r in rows]
    top_p = [r.params.top_p for r in rows]
    min_p = [r.params.min_p for r in rows]
    if all(k == probs.shape[-1] for k in top_k) and all(p == 1.0 for p in top_p) and not any(min_p):
        return probs
    device = probs.device
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=device)[None, :]
    drop = rank >= to_device(top_k, device)[:, None]
    # top-p: drop a token when the mass before it already reaches p (the top token always stays)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= mass_before >= to_device(top_p, device, torch.float32)[:, None]
    threshold = to_device(min_p, device, torch.float32)[:, None] * sorted_probs[:, :1]
    drop |= sorted_probs < threshold
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def token_logprobs(
    raw: torch.Tensor, tokens: list[int], rows: Sequence[SamplingRow]
) -> list[TokenLogprobs | None]:
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    result: list[TokenLogprobs | None] = [None] * len(rows)
    if not wanted:
        return result
    index = torch.tensor(wanted, device=raw.device)
    log_probs = torch.log_softmax(raw[index], dim=-1)
    for j, i in enumerate(wanted):
        count = rows[i].params.logprobs
        top_values, top_ids = log_probs[j].topk(count) if count else (torch.empty(0),) * 2
        result[i] = TokenLogprobs(
            token_id=tokens[i],
            logprob=float(log_probs[j, tokens[i]]),
            top=list(zip(top_ids.tolist(), top_values.tolist(), strict=True)),
        )
    return result
