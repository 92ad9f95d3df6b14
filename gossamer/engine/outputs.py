"""What the engine hands back to its callers (LLM, AsyncEngine, the server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gossamer.runner.sampler import TokenLogprobs


@dataclass
class RequestOutput:
    """One update of one request: the tokens and text produced since the previous update.

    A request with SamplingParams.n > 1 reports each of its choices with its own `index`."""

    request_id: str
    index: int  # choice index, 0..n-1
    new_token_ids: list[int]
    text_delta: str
    new_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # all tokens of this choice so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # set when finish_reason == "error"


@dataclass
class CompletionOutput:
    """The whole result of one choice, for offline `LLM.generate`."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs | None] | None = None


@dataclass
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0


@dataclass
class EngineStats:
    """A snapshot for /metrics and logs."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use
    prefix_cache_queries: int = 0  # tokens looked up, cumulative
    prefix_cache_hits: int = 0  # tokens found, cumulative
    num_preemptions: int = 0  # cumulative
    prompt_tokens: int = 0  # cumulative, computed (not cached) prompt tokens
    generation_tokens: int = 0  # cumulative
    # cumulative target-model steps by how they ran: "graph" (CUDA-graph replay) or the reason
    # they ran eagerly (gossamer/runner/model_runner.py, EAGER_*); "unreported" counts steps of a
    # runner that keeps no count (EAGLE-3's target runner, always eager)
    runner_steps: dict[str, int] = field(default_factory=dict)
    spec_stats: dict[str, float] = field(default_factory=dict)
