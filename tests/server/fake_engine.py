"""A scripted engine with the EngineClient interface, for server tests.

`script(prompt_text, choice_index)` returns the completion as text with Harmony special tokens
(e.g. "<|channel|>final<|message|>Hi<|return|>"); it is tokenized with the real o200k_harmony
tokenizer and streamed a few tokens per update, honouring stop token ids, stop strings,
max_tokens, logprobs and n like the real engine. The prompt text handed to the script is the
rendered prompt decoded with its special tokens, so a script can check what the server rendered.
It records what it saw, which requests were aborted or closed early, and keeps EngineStats.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from gossamer.engine.detokenizer import TextState
from gossamer.engine.errors import PromptTooLongError
from gossamer.engine.outputs import EngineStats, RequestOutput
from gossamer.runner.sampler import TokenLogprobs
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer

DEFAULT_COMPLETION = (
    "<|channel|>analysis<|message|>thinking<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"
)
Script = Callable[[str, int], str]


@dataclass
class SeenRequest:
    request_id: str
    prompt_ids: list[int]
    prompt_text: str
    params: SamplingParams
    cache_salt: str | None


@dataclass
class FakeEngine:
    tokenizer: Tokenizer
    model_name: str = "fake-gpt-oss"
    max_model_len: int = 4096
    script: Script = field(default=lambda prompt, index: DEFAULT_COMPLETION)
    token_delay: float = 0.0  # seconds before each update
    tokens_per_update: int = 1
    cached_tokens: int = 0  # reported as prefix-cache hits for every prompt
    engine_prompt_limit: int | None = None  # raise PromptTooLongError above this many tokens
    fail_after: int | None = None  # raise RuntimeError after this many updates
    error_after: int | None = None  # yield finish_reason="error" after this many updates
    ready: bool = True
    seen: list[SeenRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)  # abort() calls
    closed_early: list[str] = field(default_factory=list)  # generators closed before the end
    active: set[str] = field(default_factory=set)
    _stats: EngineStats = field(default_factory=EngineStats)

    def reset(self) -> None:
        defaults = FakeEngine(self.tokenizer)
        for name in ("script", "token_delay", "tokens_per_update", "cached_tokens"):
            setattr(self, name, getattr(defaults, name))
        self.engine_prompt_limit = self.fail_after = self.error_after = None
        self.ready = True
        self.max_model_len = defaults.max_model_len
        self.seen.clear()
        self.aborted.clear()
        self.closed_early.clear()

    # -- EngineClient ----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return self.ready

    def stats(self) -> EngineStats:
        self._stats.num_running = len(self.active)
        self._stats.kv_cache_usage = min(1.0, len(self.active) / 10)
        return EngineStats(**vars(self._stats))

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if (
            self.engine_prompt_limit is not None
            and len(prompt_token_ids) > self.engine_prompt_limit
        ):
            raise PromptTooLongError(
                f"prompt has {len(prompt_token_ids)} tokens, the limit is "
                f"{self.engine_prompt_limit}",
                param="messages",
            )
        prompt_text = self.tokenizer.decode(prompt_token_ids)
        self.seen.append(
            SeenRequest(request_id, list(prompt_token_ids), prompt_text, params, cache_salt)
        )
        self._stats.prompt_tokens += len(prompt_token_ids) - self.cached_tokens
        self._stats.prefix_cache_queries += len(prompt_token_ids)
        self._stats.prefix_cache_hits += self.cached_tokens
        self.active.add(request_id)
        done = False
        try:
            choices = [
                _Choice(self, prompt_text, index, params, len(prompt_token_ids))
                for index in range(params.n)
            ]
            updates = 0
            while any(not choice.finished for choice in choices):
                for choice in choices:
                    if choice.finished:
                        continue
                    await asyncio.sleep(self.token_delay)
                    updates += 1
                    if self.fail_after is not None and updates > self.fail_after:
                        raise RuntimeError("the fake engine exploded")
                    if self.error_after is not None and updates > self.error_after:
                        yield choice.error_output(request_id)
                        done = True
                        return
                    output = choice.step(request_id, self.tokens_per_update)
                    self._stats.generation_tokens += len(output.new_token_ids)
                    steps = self._stats.runner_steps
                    steps["graph"] = steps.get("graph", 0) + 1  # one replayed step per update
                    yield output
            done = True
        finally:
            self.active.discard(request_id)
            if not done:
                self.closed_early.append(request_id)


class _Choice:
    def __init__(
        self,
        engine: FakeEngine,
        prompt_text: str,
        index: int,
        params: SamplingParams,
        num_prompt: int,
    ) -> None:
        self.engine = engine
        self.index = index
        self.params = params
        self.num_prompt = num_prompt
        self.tokens = engine.tokenizer.encode(engine.script(prompt_text, index), allow_special=True)
        self.position = 0
        self.text = TextState(
            engine.tokenizer,
            params.stop,
            params.include_stop_str_in_output,
            params.skip_special_tokens,
        )
        self.finished = False

    def step(self, request_id: str, count: int) -> RequestOutput:
        new_ids: list[int] = []
        finish_reason, stop_reason = None, None
        while len(new_ids) < count and finish_reason is None:
            if self.position >= len(self.tokens):  # the script ran out: as if eos
                finish_reason = "stop"
                break
            token = self.tokens[self.position]
            self.position += 1
            new_ids.append(token)
            self.text.add_token(token)
            if token in self.params.stop_token_ids and self.position > self.params.min_tokens:
                finish_reason, stop_reason = "stop", token
            elif self.text.stopped_by is not None:
                finish_reason, stop_reason = "stop", self.text.stopped_by
            elif self.params.max_tokens is not None and self.position >= self.params.max_tokens:
                finish_reason = "length"
        self.finished = finish_reason is not None
        if self.finished:
            self.text.finish()
        return RequestOutput(
            request_id=request_id,
            index=self.index,
            new_token_ids=new_ids,
            text_delta=self.text.take_delta(final=self.finished),
            new_logprobs=[self._logprobs(token) for token in new_ids],
            finished=self.finished,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=self.num_prompt,
            num_output_tokens=self.position,
            num_cached_tokens=self.engine.cached_tokens,
        )

    def error_output(self, request_id: str) -> RequestOutput:
        self.finished = True
        return RequestOutput(
            request_id, self.index, [], "", finished=True, finish_reason="error",
            error="fake device failure",
        )  # fmt: skip

    def _logprobs(self, token: int) -> TokenLogprobs | None:
        if self.params.logprobs is None:
            return None
        # The sampled token first, then made-up runners-up with lower logprobs.
        top = [(token, -0.25)] + [(1000 + k, -2.0 - k) for k in range(self.params.logprobs)]
        return TokenLogprobs(token, -0.25, top[: self.params.logprobs])
