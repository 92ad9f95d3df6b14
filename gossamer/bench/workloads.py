"""Workloads: what the benchmark sends. Every workload is a stream of `Conversation`s; a
single-shot request is a conversation of one turn, so one load generator serves them all.

- `random`: one turn of exactly `input_len` tokens (with a tokenizer), asking for `output_len`.
- `sharegpt`: first human turn of each ShareGPT conversation; output length from the reply.
- `prefix`: `prefix_groups` shared system prompts x `prefix_questions` questions each, shuffled,
  to exercise prefix caching and cache-aware routing.
- `multiturn`: conversations of `turns` user turns; each turn carries the previous answers.

Streams are deterministic for a seed. They never end (sharegpt cycles through the file, the
others keep making fresh text), so `--duration` runs need no size up front.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gossamer.bench.errors import BenchConfigError
from gossamer.bench.prompts import PromptBuilder

WORKLOADS = ("random", "sharegpt", "prefix", "multiturn")

# ShareGPT filtering as in vLLM's ShareGPT sampler, so request mixes stay comparable.
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_PROMPT_TOKENS = 1024
SHAREGPT_MAX_TOTAL_TOKENS = 2048


@dataclass(frozen=True)
class Turn:
    text: str  # the user message
    num_tokens: int  # tokens in `text` (exact with a tokenizer, else an estimate)
    max_output_tokens: int


@dataclass(frozen=True)
class Conversation:
    conversation_id: int
    turns: tuple[Turn, ...]
    system_prompt: str | None = None
    system_tokens: int = 0
    prefix_group: int | None = None  # which shared system prompt (prefix workload)

    def first_turns(self, count: int) -> Conversation:
        return dataclasses.replace(self, turns=self.turns[:count])


@dataclass(frozen=True)
class WorkloadSpec:
    name: str = "random"
    input_len: int = 1024  # random: prompt; prefix: question; multiturn: each user turn
    output_len: int = 128
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    dataset_path: str | None = None  # sharegpt JSON file
    sharegpt_output_len: int | None = None  # override the reply length from the file
    prefix_groups: int = 4
    prefix_questions: int = 8
    prefix_len: int = 1024
    turns: int = 4

    def validate(self) -> None:
        if self.name not in WORKLOADS:
            raise BenchConfigError(f"unknown workload {self.name!r}; choose one of {WORKLOADS}")
        if self.input_len < 1 or self.output_len < 1:
            raise BenchConfigError("--input-len and --output-len must be at least 1")
        if not 0.0 <= self.range_ratio < 1.0:
            raise BenchConfigError("--range-ratio must be in [0, 1)")
        if self.name == "sharegpt" and not self.dataset_path:
            raise BenchConfigError("the sharegpt workload needs --dataset-path FILE.json")
        if min(self.prefix_groups, self.prefix_questions, self.turns) < 1:
            raise BenchConfigError("--prefix-groups, --prefix-questions and --turns must be >= 1")
        if self.prefix_len < 0:
            raise BenchConfigError("--prefix-len must be >= 0")


def conversations(
    spec: WorkloadSpec, builder: PromptBuilder, seed: int | str
) -> Iterator[Conversation]:
    """The endless, seeded stream of conversations for `spec`."""
    spec.validate()
    rng = random.Random(seed)
    makers = {
        "random": _random_stream,
        "sharegpt": _sharegpt_stream,
        "prefix": _prefix_stream,
        "multiturn": _multiturn_stream,
    }
    return makers[spec.name](spec, builder, rng)


def take_requests(stream: Iterator[Conversation], num_requests: int) -> list[Conversation]:
    """Conversations holding exactly `num_requests` turns in all (the last one is cut short)."""
    taken: list[Conversation] = []
    remaining = num_requests
    for conversation in stream:
        if remaining <= 0:
            break
        taken.append(conversation.first_turns(remaining))
        remaining -= len(taken[-1].turns)
    return taken


def _sample_len(length: int, ratio: float, rng: random.Random) -> int:
    low, high = max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio))
    return rng.randint(low, high)


def _turn(spec: WorkloadSpec, builder: PromptBuilder, rng: random.Random) -> Turn:
    num_tokens = _sample_len(spec.input_len, spec.range_ratio, rng)
    text = builder.make(num_tokens, rng)
    num_tokens = builder.count(text) if builder.exact else num_tokens
    return Turn(text, num_tokens, _sample_len(spec.output_len, spec.range_ratio, rng))


def _random_stream(spec, builder, rng) -> Iterator[Conversation]:
    for conversation_id in itertools.count():
        yield Conversation(conversation_id, (_turn(spec, builder, rng),))


def _multiturn_stream(spec, builder, rng) -> Iterator[Conversation]:
    for conversation_id in itertools.count():
        turns = tuple(_turn(spec, builder, rng) for _ in range(spec.turns))
        yield Conversation(conversation_id, turns)


def _prefix_stream(spec, builder, rng) -> Iterator[Conversation]:
    systems = [builder.make(spec.prefix_len, rng) for _ in range(spec.prefix_groups)]
    system_tokens = [builder.count(s) if builder.exact else spec.prefix_len for s in systems]
    conversation_ids = itertools.count()
    while True:  # each round: every group once per question, in a shuffled order
        order = [g for g in range(spec.prefix_groups) for _ in range(spec.prefix_questions)]
        rng.shuffle(order)
        for group in order:
            yield Conversation(
                next(conversation_ids),
                (_turn(spec, builder, rng),),
                system_prompt=systems[group],
                system_tokens=system_tokens[group],
                prefix_group=group,
            )


def _sharegpt_stream(spec, builder, rng) -> Iterator[Conversation]:
    # Read the file now, not at the first request, so a bad file fails before any load.
    pairs = _load_sharegpt_pairs(Path(spec.dataset_path), builder, spec.sharegpt_output_len)

    def cycle() -> Iterator[Conversation]:
        conversation_ids = itertools.count()
        while True:  # each pass over the file in a fresh shuffled order
            order = list(pairs)
            rng.shuffle(order)
            for prompt, prompt_tokens, output_tokens in order:
                turn = Turn(prompt, prompt_tokens, output_tokens)
                yield Conversation(next(conversation_ids), (turn,))

    return cycle()


def _load_sharegpt_pairs(
    path: Path, builder: PromptBuilder, output_len: int | None
) -> list[tuple[str, int, int]]:
    """(prompt, prompt tokens, output tokens) for each usable ShareGPT conversation."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchConfigError(f"cannot read ShareGPT file {path}: {exc}") from exc
    if not isinstance(entries, list):
        raise BenchConfigError(f"{path} must hold a JSON list of {{'conversations': [...]}}")
    pairs = []
    for entry in entries:
        first_two = _first_exchange(entry)
        if first_two is None:
            continue
        prompt, reply = first_two
        prompt_tokens = builder.count(prompt)
        output_tokens = output_len or builder.count(reply)
        if _keep_sharegpt(prompt_tokens, output_tokens, output_len is not None):
            pairs.append((prompt, prompt_tokens, output_tokens))
    if not pairs:
        raise BenchConfigError(f"{path} has no usable conversation (human turn then a reply)")
    return pairs


def _first_exchange(entry) -> tuple[str, str] | None:
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    texts = [t.get("value", t.get("content")) for t in turns[:2] if isinstance(t, dict)]
    roles = [t.get("from", t.get("role")) for t in turns[:2] if isinstance(t, dict)]
    if len(texts) < 2 or not all(isinstance(x, str) and x for x in texts):
        return None
    if roles[0] not in ("human", "user"):
        return None
    return texts[0], texts[1]


def _keep_sharegpt(prompt_tokens: int, output_tokens: int, output_fixed: bool) -> bool:
    if prompt_tokens < SHAREGPT_MIN_TOKENS:
        return False
    if not output_fixed and output_tokens < SHAREGPT_MIN_TOKENS:
        return False
    return (
        prompt_tokens <= SHAREGPT_MAX_PROMPT_TOKENS
        and prompt_tokens + output_tokens <= SHAREGPT_MAX_TOTAL_TOKENS
    )
