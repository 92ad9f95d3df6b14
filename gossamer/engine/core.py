"""EngineCore: one `step()` = schedule -> run the model -> sample -> update -> detokenize.

It is single-threaded; `LLM` drives it in a loop and `AsyncEngine` from a background thread.
Everything it needs (model runner, tokenizer) is passed in, so tests can give it a null model.
With `async_scheduling`, plain decode steps overlap: the next step is launched before the host
applies the current one's tokens (gossamer/engine/overlap.py). With a speculator they do so while
it is idle at the running batch (Speculator.may_run_ahead): then the engine runs as one without
a speculator, and it speculates again once a synchronous step finds the batch no longer idle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from gossamer.cache.layout import KVCacheLayout, num_blocks_for_memory
from gossamer.cache.manager import KVCacheManager
from gossamer.engine.detokenizer import TextState
from gossamer.engine.errors import PromptTooLongError, RequestError
from gossamer.engine.outputs import EngineStats, RequestOutput
from gossamer.engine.overlap import (
    HostSlack,
    InFlightStep,
    is_plain_decode,
    needs_host_tokens,
    sample_on_device,
)
from gossamer.runner.model_runner import ModelRunner, SeqInput
from gossamer.runner.sampler import Sampler, SampleResult, SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.scheduler import (
    DuplicateRequestError,
    FinishReason,
    Request,
    RequestTooLargeError,
    RequestUpdate,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from gossamer.spec.config import SpecConfig
from gossamer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

GiB = 1 << 30
UNREPORTED_STEPS = "unreported"  # EngineStats.runner_steps: a runner without step_modes


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None  # bytes; None: see kv_cache_bytes()
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None  # exact block count (tests); overrides the memory budget
    cuda_graphs: bool = True
    warmup: bool = True  # compile the Triton kernels of every step shape at start-up
    seed: int = 0
    speculative_config: SpecConfig | None = None  # see gossamer/spec/config.py
    # launch the next plain decode step before applying this one's tokens (engine/overlap.py);
    # with speculative decoding, while speculation is idle at the batch
    async_scheduling: bool = False
    # "auto": keys and values in the model's dtype; "fp8" (or "fp8_e4m3"): float8 e4m3 with a
    # scale of 1, half the bytes (twice the tokens in a budget, half the reads of long contexts)
    kv_cache_dtype: str = "auto"


@dataclass
class _Choice:
    """Engine-side state of one choice (one scheduler request) of a user request."""

    request_id: str  # the user's id
    index: int
    request: Request
    params: SamplingParams
    generator: torch.Generator | None
    text: TextState | None
    tables: BlockTables | None = None  # the runner's copy
    pending_children: list[Request] = field(default_factory=list)
    # built once: it reads the request's token lists, which grow in place
    row: SamplingRow | None = None


class EngineCore:
    def __init__(
        self,
        model,
        tokenizer: Tokenizer | None,
        config: EngineConfig = EngineConfig(),
        runner: ModelRunner | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model.config
        self.max_model_len = model.max_model_len
        layout = KVCacheLayout.from_model_config(model.config)
        self.kv_cache_dtype = kv_cache_dtype(config.kv_cache_dtype, model.dtype, model.device)
        self.num_blocks = config.num_blocks or _blocks_for_budget(
            model, layout, config, self.kv_cache_dtype
        )
        logger.info(
            "KV cache: %d blocks of %d tokens in %s", self.num_blocks, config.block_size,
            str(self.kv_cache_dtype).removeprefix("torch."),
        )  # fmt: skip
        self.kv_cache_manager = KVCacheManager.from_layout(
            layout,
            self.num_blocks,
            block_size=config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.eos_token_ids = tuple(
            tokenizer.eos_token_ids if tokenizer is not None else model.config.eos_token_ids
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
        )
        # Speculative decoding: one hook object (gossamer/spec/speculator.py); None when off.
        self.speculator = None
        runner_class = ModelRunner
        graph_query_lens: tuple[int, ...] = (1,)
        tree_options: dict[str, int] = {}
        if config.speculative_config is not None:
            from gossamer.spec.build import build_speculator

            self.speculator = build_speculator(
                config.speculative_config, model, config, self.num_blocks
            )
            runner_class = self.speculator.target_runner_class or ModelRunner
            # verification steps where every request carries k drafts replay a graph too; the
            # speculator pads drafts to one of these k
            ladder = config.speculative_config.draft_len_ladder
            if config.speculative_config.tree is None:
                graph_query_lens = (1, *(1 + k for k in ladder))
            else:  # tree verification steps replay the runner's tree graphs
                tree_options["tree_query_len"] = 1 + config.speculative_config.tree.num_nodes
        self.runner = runner or runner_class(
            model,
            num_blocks=self.num_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            cuda_graphs=config.cuda_graphs,
            graph_query_lens=graph_query_lens,
            warmup=config.warmup,
            kv_cache_dtype=self.kv_cache_dtype,
            **tree_options,
        )
        if self.speculator is not None:  # the cost-aware k's step costs, timed on this runner
            self.speculator.calibrate(self.runner, self.num_blocks)
        self.sampler = Sampler(config.seed)
        self.num_cache_groups = len(layout.groups)
        self.max_blocks_per_seq = -(-self.max_model_len // config.block_size)
        self.choices: dict[str, _Choice] = {}  # scheduler request id -> choice
        self.user_requests: dict[str, list[str]] = {}  # user id -> scheduler ids
        self.stats = EngineStats()
        self._num_runner_steps = 0  # runner.run calls, to spot steps a runner did not count
        self._in_flight: InFlightStep | None = None  # async_scheduling: launched, not applied
        self._slack = HostSlack()  # whether the speculator's deferred work fits the waits
        self.num_overlapped_steps = 0  # steps launched before the previous one's tokens came

    # ---- requests ------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; raises RequestError for input that can never run."""
        if request_id in self.user_requests:
            raise RequestError(f"request id {request_id!r} is already running", "request_id")
        self._check_length(prompt_token_ids, params)
        ids = [request_id] if params.n == 1 else [f"{request_id}#{i}" for i in range(params.n)]
        choices = [
            self._new_choice(request_id, i, ids[i], prompt_token_ids, params, cache_salt)
            for i in range(params.n)
        ]
        try:
            self.scheduler.add_request(choices[0].request)
        except (RequestTooLargeError, DuplicateRequestError) as error:
            raise RequestError(str(error), "messages") from error
        # NOTE: the other choices wait until the first has computed the prompt, then fork its
        # blocks (copy-free) instead of computing the prompt again.
        choices[0].pending_children = [c.request for c in choices[1:]]
        for choice in choices:
            self.choices[choice.request.request_id] = choice
        self.user_requests[request_id] = ids

    def _check_length(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise RequestError("the prompt is empty", "prompt")
        limit = self.max_model_len
        wanted = len(prompt) + (params.max_tokens or 1)
        if len(prompt) >= limit or (params.max_tokens is not None and wanted > limit):
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{wanted} tokens ({len(prompt)} in the prompt, {params.max_tokens} for the "
                "completion). Please reduce the prompt or max_tokens.",
                "messages",
            )
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {vocab})", "prompt")

    def _new_choice(
        self,
        request_id: str,
        index: int,
        internal_id: str,
        prompt: list[int],
        params: SamplingParams,
        cache_salt: str | None,
    ) -> _Choice:
        request = Request(internal_id, list(prompt), params, cache_salt=cache_salt)
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed + index)
        text = None
        if self.tokenizer is not None:
            text = TextState(
                self.tokenizer,
                params.stop,
                params.include_stop_str_in_output,
                params.skip_special_tokens,
            )
        return _Choice(request_id, index, request, params, generator, text)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """End every choice of a user request now; its blocks are free when this returns."""
        outputs = []
        for internal_id in self.user_requests.get(request_id, []):
            self.scheduler.abort(internal_id)
            choice = self.choices.pop(internal_id, None)
            if choice is not None:
                outputs.append(self._final_output(choice, "abort"))
        # NOTE: forgotten last, so that another thread never sees the request gone before its
        # blocks are back in the pool.
        self.user_requests.pop(request_id, None)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self.user_requests)

    # ---- one step ------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.config.async_scheduling:
            return self._step_overlapped()
        scheduled = self._schedule()
        return self._apply(scheduled, *self._run_and_sample(scheduled))

    def _schedule(self) -> SchedulerOutput:
        scheduled = self.scheduler.schedule()
        self.stats.num_preemptions += len(scheduled.preempted_request_ids)
        return scheduled

    def _apply(
        self,
        scheduled: SchedulerOutput,
        sampled: dict[str, list[int]],
        logprobs: dict[str, list],
        next_in_flight: bool = False,
    ) -> list[RequestOutput]:
        """Everything after the sampled tokens reach the host: update, detokenize, outputs.
        `next_in_flight`: the following step is already running (overlapped)."""
        updates = self.scheduler.update(scheduled, sampled)
        outputs = [self._process(update, logprobs.get(update.request_id)) for update in updates]
        self._fork_pending_children()
        if self.speculator is not None:
            self.speculator.after_step(
                self.scheduler, scheduled, sampled, self._spec_row, next_in_flight
            )
        self._refresh_stats(scheduled, updates)
        return [output for output in outputs if output is not None]

    def _step_overlapped(self) -> list[RequestOutput]:
        """One step of overlapped scheduling (engine/overlap.py): launch the step after the one
        in flight when the scheduler can tell it now, then apply the one in flight."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and not any(rid in self.choices for rid in in_flight.request_ids):
            in_flight = None  # every request of it ended (its last step computed extra tokens)
        if in_flight is None:
            scheduled = self._schedule()
            if not self._may_overlap(scheduled):
                return self._apply(scheduled, *self._run_and_sample(scheduled))
            in_flight = self._launch(scheduled)
        following = None
        if self._speculation_idle():  # else the host proposes for the next step first
            following = self.scheduler.schedule_continuation(in_flight.scheduled)
        if following is not None:
            self._in_flight = self._launch(following, in_flight.tokens_for(following))
            self.num_overlapped_steps += 1
        background = self.speculator.background_work if self.speculator is not None else None
        sampled = self._slack.wait_for(in_flight, background)
        return self._apply(in_flight.scheduled, sampled, {}, self._in_flight is not None)

    def _may_overlap(self, scheduled: SchedulerOutput) -> bool:
        """Whether the step after `scheduled` may be launched before its tokens reach the host."""
        if not is_plain_decode(scheduled) or not self._speculation_idle():
            return False
        for item in scheduled.scheduled_requests:
            choice = self.choices[item.request_id]
            num_output = len(choice.request.output_token_ids)
            if choice.pending_children or needs_host_tokens(choice.params, num_output):
                return False
        return True

    def _speculation_idle(self) -> bool:
        """No speculator, or one that drafts nothing at the running batch and needs nothing of
        a step before the next one runs: the next step may be launched ahead."""
        if self.speculator is None:
            return True
        budget = self.scheduler.max_num_batched_tokens
        return self.speculator.may_run_ahead(self.scheduler.num_running, budget)

    def _launch(
        self, scheduled: SchedulerOutput, device_input_ids: torch.Tensor | None = None
    ) -> InFlightStep:
        """Run a plain decode step and sample it on the device; the tokens stay there."""
        seqs, sample_items, _ = self._runner_inputs(scheduled)
        if device_input_ids is None:
            logits = self.runner.run(seqs)
        else:
            logits = self.runner.run(seqs, device_input_ids=device_input_ids)
        self._num_runner_steps += 1
        rows = [self._sampling_row(self.choices[item.request_id]) for item in sample_items]
        greedy = getattr(self.runner, "last_greedy", None)  # the graph's picks, if it made them
        return InFlightStep(scheduled, sample_on_device(self.sampler, logits, rows, greedy))

    def _run_and_sample(
        self, scheduled: SchedulerOutput
    ) -> tuple[dict[str, list[int]], dict[str, list]]:
        """Run the step; per request that samples: its new tokens and their logprobs."""
        seqs, sample_items, sample_seqs = self._runner_inputs(scheduled)
        if not seqs:
            return {}, {}
        logits = self.runner.run(seqs)
        self._num_runner_steps += 1
        ids = [item.request_id for item in sample_items]
        rows = [self._sampling_row(self.choices[rid]) for rid in ids]
        if self.speculator is not None and any(item.num_draft_tokens for item in sample_items):
            self.speculator.record_step_shape(seqs)
            tokens, logprobs = self.speculator.sample(
                logits, sample_items, rows, self.sampler.shared_generator
            )
            # NOTE: before Scheduler.update, which keeps the KV of the accepted tokens' slots
            self.speculator.keep_accepted_kv(self.runner.kv_cache, sample_seqs)
            return dict(zip(ids, tokens, strict=True)), dict(zip(ids, logprobs, strict=True))
        result: SampleResult = self.sampler.sample(logits, rows)
        sampled = {rid: [token] for rid, token in zip(ids, result.token_ids, strict=True)}
        return sampled, {rid: [lp] for rid, lp in zip(ids, result.logprobs, strict=True)}

    def _runner_inputs(
        self, scheduled: SchedulerOutput
    ) -> tuple[list[SeqInput], list[ScheduledRequest], list[SeqInput]]:
        """The runner's sequences; the scheduled requests that sample, and their sequences."""
        seqs: list[SeqInput] = []
        sample_items: list[ScheduledRequest] = []
        sample_seqs: list[SeqInput] = []
        for item in scheduled.scheduled_requests:
            choice = self.choices[item.request_id]
            if choice.tables is None or item.is_new:
                choice.tables = BlockTables(self.num_cache_groups, self.max_blocks_per_seq)
            choice.tables.apply(item.block_table_start, item.new_block_ids)
            num_blocks = -(-item.end_position // self.config.block_size)
            tables = choice.tables.views(num_blocks)
            num_logits = item.num_draft_tokens + 1 if item.do_sample else 0
            tree_mask = None
            if item.num_draft_tokens and self.speculator is not None:
                tree_mask = self.speculator.tree_mask(item)  # a tree draft's (None: a chain)
            seqs.append(
                SeqInput(item.token_ids, item.start_position, tables, num_logits, tree_mask)
            )
            if item.do_sample:
                sample_items.append(item)
                sample_seqs.append(seqs[-1])
        return seqs, sample_items, sample_seqs

    def _spec_row(self, request_id: str) -> SamplingRow | None:
        choice = self.choices.get(request_id)
        return self._sampling_row(choice) if choice is not None else None

    def _sampling_row(self, choice: _Choice) -> SamplingRow:
        if choice.row is None:
            request, params = choice.request, choice.params
            stop_ids = () if params.ignore_eos else self.eos_token_ids
            choice.row = SamplingRow(
                params,
                request.prompt_token_ids,
                request.output_token_ids,
                choice.generator,
                tuple(stop_ids) + tuple(params.stop_token_ids),
            )
        return choice.row

    def _process(self, update: RequestUpdate, logprobs: list | None) -> RequestOutput | None:
        choice = self.choices.get(update.request_id)
        if choice is None:
            return None
        new_tokens = update.new_token_ids
        if choice.text is not None:
            new_tokens = _add_text(choice.text, update)
        finish_reason = update.finish_reason
        stop_reason: int | str | None = update.stop_token_id
        # speculation can accept tokens past a stop string: those are dropped, as if never made
        cut = len(new_tokens) < len(update.new_token_ids)
        if choice.text is not None and choice.text.stopped_by is not None:
            if not finish_reason or cut:
                if not finish_reason:
                    self.scheduler.finish(update.request_id, FinishReason.STOP)
                finish_reason, stop_reason = FinishReason.STOP, choice.text.stopped_by
        finished = finish_reason is not None
        if finished and choice.text is not None:
            choice.text.finish()
        output = self._output(choice, new_tokens, finished)
        output.num_output_tokens -= len(update.new_token_ids) - len(new_tokens)
        output.new_logprobs = _logprobs_of(new_tokens, logprobs)
        output.finish_reason = str(finish_reason) if finished else None
        output.stop_reason = stop_reason if finished else None
        if finished:
            self._forget(choice)
        return output

    def _output(self, choice: _Choice, new_tokens: list[int], finished: bool) -> RequestOutput:
        request = choice.request
        delta = choice.text.take_delta(final=finished) if choice.text is not None else ""
        return RequestOutput(
            request_id=choice.request_id,
            index=choice.index,
            new_token_ids=list(new_tokens),
            text_delta=delta,
            finished=finished,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=len(request.output_token_ids),
            num_cached_tokens=max(request.num_cached_tokens, 0),
        )

    def _final_output(self, choice: _Choice, reason: str) -> RequestOutput:
        output = self._output(choice, [], finished=True)
        output.finish_reason = reason
        return output

    def _forget(self, choice: _Choice) -> None:
        internal_id = choice.request.request_id
        self.choices.pop(internal_id, None)
        siblings = self.user_requests.get(choice.request_id, [])
        if internal_id in siblings:
            siblings.remove(internal_id)
        if not siblings:
            self.user_requests.pop(choice.request_id, None)
        for child in choice.pending_children:  # finished before forking: queue them plainly
            self.scheduler.add_request(child)

    def _fork_pending_children(self) -> None:
        for choice in list(self.choices.values()):
            request = choice.request
            if choice.pending_children and request.output_token_ids:
                for child in choice.pending_children:
                    self.scheduler.fork(request.request_id, child)
                choice.pending_children = []

    def _refresh_stats(self, scheduled: SchedulerOutput, updates: list[RequestUpdate]) -> None:
        stats, manager = self.stats, self.kv_cache_manager
        stats.num_running = self.scheduler.num_running
        stats.num_waiting = self.scheduler.num_waiting
        stats.kv_cache_usage = manager.usage
        cache_stats = manager.prefix_cache_stats
        stats.prefix_cache_queries = cache_stats.num_queried_tokens
        stats.prefix_cache_hits = cache_stats.num_hit_tokens
        for item in scheduled.scheduled_requests:
            if item.start_position < item.num_prompt_tokens:
                computed = min(item.end_position, item.num_prompt_tokens) - item.start_position
                stats.prompt_tokens += computed
        stats.generation_tokens += sum(len(update.new_token_ids) for update in updates)
        stats.runner_steps = self._runner_steps()
        if self.speculator is not None:
            stats.spec_stats = self.speculator.stats()

    def _runner_steps(self) -> dict[str, int]:
        modes = dict(getattr(self.runner, "step_modes", {}))
        unreported = self._num_runner_steps - sum(modes.values())
        if unreported > 0:
            modes[UNREPORTED_STEPS] = unreported
        return modes


def _add_text(text: TextState, update: RequestUpdate) -> list[int]:
    """Detokenize the update's tokens; returns them up to the one that completed a stop string."""
    tokens = update.new_token_ids
    for index, token in enumerate(tokens):
        if token != update.stop_token_id:
            text.add_token(token)
        if text.stopped_by is not None:
            return tokens[: index + 1]
    return tokens


def _logprobs_of(new_tokens: list[int], logprobs: list | None) -> list:
    """The logprobs of the tokens kept (a stop token or string may cut accepted drafts)."""
    if not logprobs or logprobs[0] is None:
        return []
    return logprobs[: len(new_tokens)]


class BlockTables:
    """A request's block tables, one int32 row per cache group, updated in place from the
    scheduler's increments so that a step never rebuilds whole tables."""

    __slots__ = ("rows", "_views")

    def __init__(self, num_groups: int, max_blocks: int) -> None:
        self.rows = np.zeros((num_groups, max_blocks), dtype=np.int32)
        self._views: tuple[int, tuple[np.ndarray, ...]] = (-1, ())  # (num_blocks, views)

    def apply(self, start: int, new_ids: tuple[tuple[int, ...], ...]) -> None:
        for group, ids in enumerate(new_ids):
            if ids:
                self.rows[group, start : start + len(ids)] = ids

    def views(self, num_blocks: int) -> tuple[np.ndarray, ...]:
        """The first `num_blocks` entries of each group's table (views: `apply` shows through,
        so they are made again only when a step's table grows or shrinks)."""
        if self._views[0] != num_blocks:
            self._views = (num_blocks, tuple(self.rows[:, :num_blocks]))
        return self._views[1]


def _blocks_for_budget(
    model, layout: KVCacheLayout, config: EngineConfig, cache_dtype: torch.dtype
) -> int:
    memory = config.kv_cache_memory or kv_cache_bytes(model.device, config.gpu_memory_utilization)
    cfg = model.config
    return num_blocks_for_memory(
        memory,
        layers_per_group=layout.layers_per_group,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        block_size=config.block_size,
        dtype=cache_dtype,
    )


# EngineConfig.kv_cache_dtype names besides "auto" (the model's dtype)
KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's element type for EngineConfig.kv_cache_dtype `name`.

    fp8 values are stored unscaled (a scale of 1): e4m3 keeps 3 mantissa bits and saturates at
    +-448, so it trades accuracy for memory and bandwidth, as other engines' fp8 caches without
    calibrated scales do. The Triton kernels need fp8 conversions in hardware (compute
    capability 8.9+); the torch ops (CPU) widen the cache to float32 for the math."""
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        choices = ", ".join(["auto", *KV_CACHE_DTYPES])
        raise ValueError(f"kv_cache_dtype must be one of {choices}, got {name!r}")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError(
            f"kv_cache_dtype={name!r} needs a GPU of compute capability 8.9 or newer (Ada, "
            f"Hopper); this one is {torch.cuda.get_device_capability(device)}: use 'auto'"
        )
    return KV_CACHE_DTYPES[name]


def kv_cache_bytes(device: torch.device, utilization: float) -> int:
    """Default KV budget: on CUDA, what stays free under `utilization` of the card after the
    weights, less room for activations; on the CPU, 1 GiB.

    Memory that torch's caching allocator holds but no tensor uses (the loader's temporaries, a
    benchmark's copy buffers) counts as free: the KV cache's allocation reuses it. The driver's
    free figure alone left an H100 1.33 GiB of KV beside 120b's 60.8 GiB of weights."""
    if device.type != "cuda":
        return GiB
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    activations = 4 * GiB
    budget = free + cached - (1 - utilization) * total - activations
    logger.info(
        "KV cache budget %.2f GiB: %.2f free + %.2f cached by torch - %.2f kept back "
        "(gpu_memory_utilization %.2f) - %.2f for activations",
        budget / GiB, free / GiB, cached / GiB, (1 - utilization) * total / GiB,
        utilization, activations / GiB,
    )  # fmt: skip
    if budget <= 0:
        raise RuntimeError(
            "no GPU memory is left for the KV cache after loading the weights; lower "
            "--max-model-len, raise --gpu-memory-utilization or pass --kv-cache-memory"
        )
    return int(budget)
