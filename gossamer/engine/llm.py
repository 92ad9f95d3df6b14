"""`LLM`: offline batch generation, the engine driven in a loop on the caller's thread."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm import tqdm

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.outputs import CompletionOutput, GenerationResult, RequestOutput
from gossamer.model.loader import load_model
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer

Prompt = str | list[int]


class LLM:
    """`LLM(model="path/or/preset").generate(prompts, SamplingParams(...))`."""

    def __init__(
        self,
        model: str,
        *,
        load_format: str = "auto",
        dtype: str = "auto",
        device: str | None = None,
        ops: str = "auto",
        max_model_len: int | None = None,
        tokenizer: Tokenizer | None = None,
        **engine_options,
    ) -> None:
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        loaded = load_model(
            model,
            load_format=load_format,
            dtype=dtype,
            device=device,
            ops=ops,
            max_model_len=max_model_len,
        )
        if tokenizer is None and loaded.checkpoint is not None:
            if (loaded.checkpoint / "tokenizer.json").is_file():
                tokenizer = Tokenizer.from_file(loaded.checkpoint)
        self.tokenizer = tokenizer
        self.engine = EngineCore(loaded.model, tokenizer, EngineConfig(**engine_options))
        self._ids = itertools.count()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerationResult]:
        """Generate for every prompt (text or token ids); results come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        all_params = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        if len(all_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        results = {}
        for prompt, p in zip(prompts, all_params, strict=True):
            request_id = str(next(self._ids))
            token_ids = self._encode(prompt)
            self.engine.add_request(request_id, token_ids, p)
            results[request_id] = _Collector(request_id, token_ids, p)
        with tqdm(total=len(results), desc="generating", disable=not use_tqdm) as progress:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    collector = results[output.request_id]
                    collector.add(output)
                    progress.update(collector.just_finished())
        return [collector.result() for collector in results.values()]

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; pass token ids")
            return self.tokenizer.encode(prompt)
        return list(prompt)


class _Collector:
    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.choices = [
            CompletionOutput(i, [], "", None, logprobs=[] if params.logprobs is not None else None)
            for i in range(params.n)
        ]
        self.num_cached = 0
        self._finished = 0
        self._reported = False

    def add(self, output: RequestOutput) -> None:
        choice = self.choices[output.index]
        choice.token_ids += output.new_token_ids
        choice.text += output.text_delta
        if choice.logprobs is not None:
            choice.logprobs += output.new_logprobs
        if output.finished:
            choice.finish_reason, choice.stop_reason = output.finish_reason, output.stop_reason
            self._finished += 1
        self.num_cached = max(self.num_cached, output.num_cached_tokens)

    def just_finished(self) -> int:
        if self._finished == len(self.choices) and not self._reported:
            self._reported = True
            return 1
        return 0

    def result(self) -> GenerationResult:
        return GenerationResult(self.request_id, self.prompt, self.choices, self.num_cached)
