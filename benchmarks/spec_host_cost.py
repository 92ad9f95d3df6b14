"""(CPU) The host time of an engine step with speculative decoding: everything but the forward.

    python benchmarks/spec_host_cost.py                          # batch 1 and 8, none/ngram/suffix/auto
    python benchmarks/spec_host_cost.py --methods auto --batch-sizes 8 --profile 25
    python benchmarks/spec_host_cost.py --methods none,auto --batch-sizes 8 --interleave \
        --verify-device-scale 3 [--profile 25 --profile-idle]   # plain steps the guard keeps
    python benchmarks/spec_host_cost.py --model gossamer/models/gpt-oss-mini --repeats 1 \
        --breakdown                                              # the real model (GPU: see below)

An EngineCore runs over an oracle model (`OracleModel`): its forward looks up, for each fed token,
the token that follows it in its request's predetermined text, and returns one-hot logits. Greedy
decoding then reproduces each request's text, and a draft is accepted exactly as far as it agrees
with that text. The texts are text-like (phrases of a small vocabulary, now and then a copy of an
earlier passage, as suffix_cost.py builds them), so n-gram and suffix drafts are accepted part of
the way (`--copy-prob` sets how often; the default gives a mean accepted length near the chat
workload's of `spec_decode.py e2e`).

The runner replays "graphs" as on the GPU (EagerGraphCapture: the padded uniform (batch, 1 + k)
steps go through the replay path) and, by default, the forward also sleeps for what the step
would take on the H200 (gpt-oss-mini's start-up calibration, BENCHMARKS.md sixth session), so
that the cost model of "auto" sees step times like the GPU's and chooses as it would there
(`--device-ms-scale 0`: no wait). The forward, wait included, is timed and subtracted: what is
reported is the host time of a step.

The workload mirrors `spec_decode.py e2e`: greedy, `--max-tokens` per request, the engine's
overlapped scheduling on (`--no-async-scheduling`: off), a warm-up batch on other texts before the
timed one. Per method and batch: decode steps of the timed batch (prefill steps left out), tokens
per step, host ms per step (mean and median; speculative steps, that verified drafts, and plain
steps apart) and host us per generated token, and a breakdown of the mean step by component.
Times are this thread's CPU time (`--clock wall`: wall clock), so that other work on a shared
machine does not inflate them; the best of `--repeats` runs by mean host time is shown. The
breakdown wraps each part (about a microsecond per call on top). NOTE: on the CPU the
verification's argmax over the logits (here 1000 tokens a row) is host work; on the GPU it is a
kernel.

Plain steps of an engine with a speculator (what auto's measured guard keeps at batch 8 on mini):
auto's guard, on the wall clock of this machine, keeps batch 8 plain for most of a run but not
always (the VM's speed drifts). `--verify-device-scale 3` makes verification steps sleep 3x longer,
so the guard keeps plain decoding throughout but for its short explorations; then `plain_ms` of
auto against `host_ms` of none is the host cost of having a speculator, and `--profile N
--profile-idle` profiles only the steps that apply a step launched ahead (idle plain decoding).
`--interleave` runs the methods' engines side by side, a step each in turn, so that the machine's
drift hits them alike (one after the other, none and auto of one run differed by up to 1.5x here).

`--model PATH`: the same measurement with a real model and spec_decode.py e2e's workload (its chat
prompts, rendered with Harmony when the checkpoint has a tokenizer, and its engine settings). On
the GPU (CUDA graphs, start-up calibration as in e2e) every runner.run is followed by a device
sync, and that wait is the "forward" subtracted: what remains is the step's host time, the
breakdown says where it goes (overlapped plain decode steps then overlap no more). On the CPU the
model's forward and logits are subtracted.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import platform
import pstats
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.presets import preset
from gossamer.runner.model_runner import DEFAULT_GRAPH_SIZES, EagerGraphCapture
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.cost import StepCost

# gpt-oss-mini's verification steps on the H200 as its engine timed them at start-up (ms per
# step, k = 0 / 1 / 2 / 4; BENCHMARKS.md, sixth session).
MINI_STEP_MS = {
    1: {0: 0.285, 1: 0.319, 2: 0.354, 4: 0.415},
    4: {0: 0.365, 1: 0.510, 2: 0.619, 4: 0.650},
    8: {0: 0.481, 1: 0.674, 2: 0.742, 4: 0.807},
}
# host time: this thread's CPU time (other processes on the machine do not inflate it), or wall
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
PROMPT_KEY = 64  # leading tokens that tell the texts apart


class DeviceTime:
    """What a (batch, 1 + k) step would take on the GPU, in seconds (0 for prompt chunks);
    `verify_scale` times that for steps that verify drafts (k > 0)."""

    def __init__(
        self,
        table: dict[int, dict[int, float]],
        scale: float,
        max_query: int,
        verify_scale: float = 1.0,
    ) -> None:
        self.cost = StepCost([(batch, sorted(points.items())) for batch, points in table.items()])
        self.plain = sorted((batch, points[0]) for batch, points in table.items())
        self.scale = scale
        self.max_query = max_query
        self.verify_scale = verify_scale

    def seconds(self, batch: int, query_len: int) -> float:
        if not self.scale or query_len > self.max_query:
            return 0.0
        below = [ms for b, ms in self.plain if b <= batch] or [self.plain[0][1]]
        scale = self.scale * (self.verify_scale if query_len > 1 else 1.0)
        return scale * below[-1] * self.cost(batch, query_len - 1) / 1e3


class OracleModel:
    """Quacks like GptOssForCausalLM for the runner: the next token of each fed token is a table
    lookup (its request's text at the next position), the logits one-hot. It tells the requests
    apart by their first block (of the full-attention group): when a prompt is fed from its
    start, its first tokens name its text, and its first block is noted. Times itself."""

    def __init__(self, vocab: int, max_model_len: int, device_time: DeviceTime) -> None:
        self.config = replace(preset("gpt-oss-20b"), vocab_size=vocab)
        self.max_model_len = max_model_len
        self.device = torch.device("cpu")
        self.dtype = torch.bfloat16
        self.num_cache_groups = 2
        self.device_time = device_time
        self.next_token = torch.zeros(1, max_model_len, dtype=torch.long)  # [texts, positions]
        self._text_of_prompt: dict[tuple[int, ...], int] = {}  # first tokens -> text
        self._text_of_block: dict[int, int] = {}  # first block id -> text
        self.seconds = 0.0  # spent in forward + compute_logits (device wait included)
        self.clock = time.perf_counter  # what `seconds` is measured with

        class _Ops:
            name = "oracle"

        self.ops = _Ops()

    def set_texts(self, texts: list[list[int]]) -> None:
        """The requests to come decode these texts (each starts with its prompt)."""
        table = torch.zeros(len(texts), self.max_model_len, dtype=torch.long)
        for index, text in enumerate(texts):
            following = torch.tensor(text[1 : self.max_model_len + 1], dtype=torch.long)
            table[index, : len(following)] = following
        self.next_token = table
        self._text_of_prompt = {tuple(text[:PROMPT_KEY]): i for i, text in enumerate(texts)}
        if len(self._text_of_prompt) != len(texts):
            raise ValueError("two texts begin alike: the model could not tell them apart")
        self._text_of_block = {}

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype=None) -> torch.Tensor:
        return torch.empty(0)

    def __call__(self, input_ids, positions, metadata, kv_cache, fed_ids=None) -> torch.Tensor:
        start = self.clock()
        if fed_ids is not None:  # tokens the runner feeds from its greedy picks (Ops.embed)
            input_ids = torch.where(input_ids < 0, fed_ids[: input_ids.shape[0]], input_ids)
        bounds = metadata.query_start_loc.tolist()
        first_blocks = metadata.block_tables[0][:, 0].tolist()
        hidden = torch.zeros(input_ids.shape[0], dtype=torch.long)  # [T] the next token ids
        for i, block in enumerate(first_blocks):
            begin, end = bounds[i], bounds[i + 1]
            if end > begin and int(positions[begin]) == 0:  # a prompt from its start
                text = self._text_of_prompt.get(
                    tuple(input_ids[begin : begin + PROMPT_KEY].tolist())
                )
                if text is not None:
                    self._text_of_block[block] = text
            text = self._text_of_block.get(block)
            if text is not None:  # else a graph's padding sequence
                hidden[begin:end] = self.next_token[text, positions[begin:end]]
        self._wait(self.device_time.seconds(len(metadata.seq_lens), metadata.max_query_len))
        self.seconds += self.clock() - start
        return hidden

    @staticmethod
    def _wait(seconds: float) -> None:
        """The GPU's share of the step: a sleep, which costs the host no CPU time (the cpu clock
        does not count it; the engine's own clock, which the cost model reads, does)."""
        if seconds > 0:
            time.sleep(seconds)

    def compute_logits(
        self, hidden: torch.Tensor, greedy_out: torch.Tensor | None = None, advance=None
    ) -> torch.Tensor:
        start = self.clock()
        logits = torch.zeros(hidden.shape[0], self.config.vocab_size)
        logits.scatter_(1, hidden[:, None], 1.0)
        if greedy_out is not None:
            greedy_out.copy_(hidden)  # the one-hot's argmax
        if advance is not None:  # (model_runner.ADVANCE_IN_GRAPH: as the real model's graphs)
            advance.apply()
        self.seconds += self.clock() - start
        return logits


def text_tokens(
    length: int,
    rng: random.Random,
    phrases: list[list[int]],
    copy_prob: float,
    start: Sequence[int] = (),
) -> list[int]:
    """`start` continued to `length` tokens: phrases in random order, and with `copy_prob` a copy
    of an earlier passage (16-64 tokens)."""
    tokens = list(start)
    while len(tokens) < length:
        if len(tokens) > 16 and rng.random() < copy_prob:
            first = rng.randrange(len(tokens) - 16)
            tokens += tokens[first : first + rng.randint(16, 64)]
        else:
            tokens += rng.choice(phrases)
    return tokens[:length]


def make_texts(args, batch: int, seed: int) -> list[list[int]]:
    """One text per request: prompt + everything the request will decode, and some. All draw on
    one set of phrases (one domain), so that other requests' outputs help suffix a little."""
    phrases = phrase_set(args)
    rng = random.Random(seed)
    length = args.prompt_tokens + args.max_tokens + 2 * args.k + 2
    return [text_tokens(length, rng, phrases, args.copy_prob) for _ in range(batch)]


def phrase_set(args) -> list[list[int]]:
    """`--phrases` phrases of 3-12 tokens from `--vocab`, fixed by `--seed`: the texts' domain."""
    vocab = random.Random(args.seed)
    return [
        [vocab.randrange(args.vocab) for _ in range(vocab.randint(3, 12))]
        for _ in range(args.phrases)
    ]


class Timers:
    """Wall time of chosen methods of live objects (wrapped on the instance), per engine step."""

    def __init__(self, clock) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.clock = clock

    def wrap(self, owner, name: str, label: str) -> None:
        method = getattr(owner, name)
        step, clock = self.step, self.clock

        def timed(*args, **kwargs):
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                step[label] += clock() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        taken = dict(self.step)
        self.step.clear()
        return taken


def oracle_engine(args, spec: SpecConfig | None, batch: int):
    """(engine, the oracle model, prompts(seed)): prompts() also hands the model their texts."""
    device_time = DeviceTime(
        MINI_STEP_MS, args.device_ms_scale, 1 + 2 * args.k, args.verify_device_scale
    )
    model = OracleModel(args.vocab, args.max_model_len, device_time)
    model.clock = CLOCKS[args.clock]
    engine = build_engine(args, spec, model, batch)

    def prompts(seed: int) -> list[list[int]]:
        texts = make_texts(args, batch, seed)
        model.set_texts(texts)
        return [text[: args.prompt_tokens] for text in texts]

    return engine, model, prompts


_LOADED: dict[str, object] = {}  # --model: loaded once per process


def load_once(args) -> tuple[object, str]:
    """(the loaded --model, its device): loaded on the first call of the process, then reused."""
    from gossamer.model.loader import load_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.model not in _LOADED:
        _LOADED[args.model] = load_model(
            args.model,
            load_format=args.load_format,
            device=device,
            dtype="bfloat16" if device == "cuda" else "float32",
            max_model_len=args.max_model_len,
        )
    return _LOADED[args.model], device


def real_model_engine(args, spec: SpecConfig | None, batch: int):
    """--model: (engine, ModelForward, prompts(seed)) with spec_decode.py e2e's workload (chat
    prompts rendered with Harmony when the checkpoint has a tokenizer) and engine settings."""
    from spec_decode import workload  # benchmarks/, beside this script

    loaded, device = load_once(args)
    config = EngineConfig(
        max_num_seqs=batch,
        kv_cache_memory=8 << 30 if device == "cuda" else 1 << 30,
        speculative_config=spec,
        async_scheduling=args.async_scheduling,
    )
    engine = EngineCore(loaded.model, None, config)
    if device == "cpu":  # the GPU's replay path, as for the oracle
        _capture_eager_graphs(engine, spec, batch)
    clock = CLOCKS["wall" if device == "cuda" else args.clock]
    return engine, ModelForward(engine, clock), lambda seed: workload(loaded, batch, seed)


def build_engine(args, spec: SpecConfig | None, model: OracleModel, batch: int) -> EngineCore:
    blocks_per_request = 2 * (-(-(args.prompt_tokens + args.max_tokens + 4 * args.k) // 16) + 2)
    config = EngineConfig(
        max_num_seqs=batch,
        num_blocks=2 * batch * blocks_per_request + 1,  # the warm-up's cached blocks too
        speculative_config=spec,
        async_scheduling=args.async_scheduling,
        cuda_graphs=False,
        warmup=False,
    )
    engine = EngineCore(model, None, config)
    _capture_eager_graphs(engine, spec, batch)
    return engine


def _capture_eager_graphs(engine: EngineCore, spec: SpecConfig | None, batch: int) -> None:
    """The GPU's replay path (padding, uploads, output slices) for the uniform steps, on the CPU:
    a "replay" runs the forward again on the same buffers."""
    sizes = [size for size in DEFAULT_GRAPH_SIZES if size <= batch]
    query_lens = (1,) if spec is None else (1, *(1 + k for k in spec.draft_len_ladder))
    engine.runner.capture_graphs(sizes, query_lens, EagerGraphCapture())


def instrument(engine: EngineCore, clock) -> Timers:
    timers = Timers(clock)
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.scheduler, "schedule_continuation", "schedule")
    timers.wrap(engine.scheduler, "update", "scheduler.update")
    timers.wrap(engine.runner, "run", "runner.run")
    timers.wrap(engine.sampler, "sample", "sampler.sample")
    speculator = engine.speculator
    if speculator is not None:
        timers.wrap(speculator, "sample", "verify (Speculator.sample)")
        timers.wrap(speculator, "keep_accepted_kv", "keep_accepted_kv")
        timers.wrap(speculator, "after_step", "after_step")
        for method, proposer in speculator.proposers.items():
            timers.wrap(proposer, "propose", f"  {method}.propose")
    return timers


@dataclass
class Row:
    method: str
    batch: int
    steps: int = 0
    spec_steps: int = 0
    tokens: int = 0
    host_ms: list[float] = field(default_factory=list)
    spec_host_ms: list[float] = field(default_factory=list)
    plain_host_ms: list[float] = field(default_factory=list)
    forward_ms: float = 0.0
    parts_ms: dict[str, float] = field(default_factory=dict)
    spec_stats: dict[str, float] = field(default_factory=dict)

    @property
    def mean_host_ms(self) -> float:
        return statistics.fmean(self.host_ms) if self.host_ms else 0.0

    def line(self) -> str:
        mean, median = self.mean_host_ms, statistics.median(self.host_ms)
        spec = _mean(self.spec_host_ms)
        plain = _mean(self.plain_host_ms)
        per_token = 1e3 * sum(self.host_ms) / max(self.tokens, 1)
        return (
            f"{self.method:7s} {self.batch:5d} {self.steps:6d} {self.spec_steps:6d} "
            f"{self.tokens / max(self.steps, 1) / self.batch:6.2f} {mean:8.3f} {median:8.3f} "
            f"{spec:8.3f} {plain:8.3f} {per_token:8.1f} {self.forward_ms / self.steps:8.3f}"
        )


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


class ModelForward:
    """--model: what is subtracted from a step of a real model. On the GPU, the wait for the
    device right after each runner.run (the forward's kernels, less what ran while the host
    still filled and launched), so that the step's host time remains; the engine's own overlap
    of plain decode steps is lost to that wait. On the CPU, the model's forward and logits."""

    def __init__(self, engine: EngineCore, clock) -> None:
        self.seconds = 0.0
        self.clock = clock
        runner = engine.runner
        if runner.device.type == "cuda":
            self._wait_after(runner)
        else:
            self._time_calls(runner.model)

    def _wait_after(self, runner) -> None:
        run = runner.run

        def run_and_wait(*args, **kwargs):
            logits = run(*args, **kwargs)
            start = self.clock()
            torch.cuda.synchronize()
            self.seconds += self.clock() - start
            return logits

        runner.run = run_and_wait

    def _time_calls(self, model) -> None:
        """Wraps the model's forward and compute_logits once (engines share the model); the
        wrappers add to the meter of the latest engine."""
        model._forward_meter = self
        if getattr(model, "_timed_by_spec_host_cost", False):
            return
        model._timed_by_spec_host_cost = True
        for name in ("forward", "compute_logits"):
            method = getattr(model, name)

            def timed(*args, _method=method, **kwargs):
                meter = model._forward_meter
                start = meter.clock()
                try:
                    return _method(*args, **kwargs)
                finally:
                    meter.seconds += meter.clock() - start

            setattr(model, name, timed)


def run_batch(engine: EngineCore, forward, prompts, args, row: Row | None, timers=None):
    """Decode `prompts` to the end; with `row`, record each decode step. `forward`: what to
    subtract (an OracleModel, a ModelForward), its `seconds` and `clock`. Returns the profiler
    (--profile) or None."""
    return _drain(batch_steps(engine, forward, prompts, args, row, timers))


def batch_steps(engine: EngineCore, forward, prompts, args, row: Row | None, timers=None):
    """`run_batch` one engine step at a time: each `next` runs one (--interleave takes turns)."""
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{index}", prompt, params)
    if timers is not None:
        timers.take()
    clock = forward.clock
    # wall clock (the cpu clock costs a system call per event): time.sleep is the "device"
    profiler = cProfile.Profile() if row is not None and args.profile else None
    while engine.has_unfinished_requests():
        yield
        prompt_before = engine.stats.prompt_tokens
        drafts_before = engine.stats.spec_stats.get("num_drafts", 0)
        forward_before = forward.seconds
        # --profile-idle: only steps that apply a step launched ahead (overlapped plain decoding)
        profiled = profiler is not None and (not args.profile_idle or engine._in_flight is not None)
        if profiled:
            profiler.enable()
        start = clock()
        outputs = engine.step()
        seconds = clock() - start
        if profiled:
            profiler.disable()
        parts = timers.take() if timers is not None else {}
        if row is None or engine.stats.prompt_tokens != prompt_before:
            continue  # the warm-up, or a step that computed a prompt chunk
        forward_seconds = forward.seconds - forward_before
        host_ms = 1e3 * (seconds - forward_seconds)
        row.steps += 1
        row.tokens += sum(len(out.new_token_ids) for out in outputs)
        row.host_ms.append(host_ms)
        row.forward_ms += 1e3 * forward_seconds
        if engine.stats.spec_stats.get("num_drafts", 0) != drafts_before:
            row.spec_steps += 1
            row.spec_host_ms.append(host_ms)
        else:
            row.plain_host_ms.append(host_ms)
        if "runner.run" in parts:
            parts["runner.run (less forward)"] = parts.pop("runner.run") - forward_seconds
        for name, value in parts.items():
            row.parts_ms[name] = row.parts_ms.get(name, 0.0) + 1e3 * value
    return profiler


def _drain(steps):
    """Runs a generator to its end; returns what it returned."""
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


def measure(
    args, methods: list[tuple[str, SpecConfig | None]], batch: int
) -> list[tuple[Row, object]]:
    """One engine per method: a warm-up batch, then the timed one (other prompts). Several
    engines (--interleave) decode their timed batches a step each in turn, so that the drift of
    a shared machine's speed hits them alike."""
    timed = []
    for name, spec in methods:
        if args.model:
            engine, forward, prompts = real_model_engine(args, spec, batch)
        else:
            engine, forward, prompts = oracle_engine(args, spec, batch)
        run_batch(engine, forward, prompts(1000 + batch), args, None)
        timers = instrument(engine, forward.clock) if args.breakdown and not args.profile else None
        row = Row(name, batch)
        steps = batch_steps(engine, forward, prompts(batch), args, row, timers)
        timed.append((engine, row, dict(engine.stats.spec_stats), steps))
    profilers = _take_turns([steps for *_, steps in timed])
    for engine, row, before, _ in timed:
        after = engine.stats.spec_stats
        row.spec_stats = {
            key: after[key] - before.get(key, 0) for key in after if key.startswith("num_")
        }
    return [(row, profiler) for (_, row, _, _), profiler in zip(timed, profilers, strict=True)]


def _take_turns(runs: list) -> list[object]:
    """Steps the generators in turn until all end; returns what each returned."""
    results: list[object] = [None] * len(runs)
    active = dict(enumerate(runs))
    while active:
        for index, steps in list(active.items()):
            try:
                next(steps)
            except StopIteration as stop:
                results[index] = stop.value
                del active[index]
    return results


def method_configs(args) -> dict[str, SpecConfig | None]:
    k = args.k
    table = {
        str(b): {str(kk): ms for kk, ms in points.items()} for b, points in MINI_STEP_MS.items()
    }
    configs: dict[str, SpecConfig | None] = {
        "none": None,
        "ngram": SpecConfig(method="ngram", num_speculative_tokens=k),
        "suffix": SpecConfig(method="suffix", num_speculative_tokens=k),
        # as auto on the GPU: the step costs its engine timed (here the H200's, given)
        "auto": SpecConfig(method="auto", num_speculative_tokens=k, cost_table=table),
    }
    return {name: configs[name] for name in args.methods.split(",")}


HEADER = (
    "method  batch  steps  specs  tok/st  host_ms  median   spec_ms  plain_ms  us/token  fwd_ms"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="none,ngram,suffix,auto")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--vocab", type=int, default=1000, help="the model's vocabulary")
    parser.add_argument("--phrases", type=int, default=300)
    parser.add_argument("--copy-prob", type=float, default=0.5)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="best of (by mean host time)")
    parser.add_argument(
        "--device-ms-scale",
        type=float,
        default=1.0,
        help="sleep this times mini's H200 step time per forward (0: none)",
    )
    parser.add_argument(
        "--verify-device-scale",
        type=float,
        default=1.0,
        help="steps that verify drafts sleep this much longer (e.g. 3: auto's guard surely keeps "
        "plain decoding, whose host cost per step is then what is measured)",
    )
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--model",
        default=None,
        help="a real model instead of the oracle (checkpoint folder or preset; on the GPU: "
        "wall clock, a device sync after each runner.run)",
    )
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--breakdown", action="store_true", help="time the step's parts (adds a little to each)"
    )
    parser.add_argument("--profile", type=int, default=0, help="cProfile's top N (one run each)")
    parser.add_argument(
        "--profile-idle",
        action="store_true",
        help="profile only the steps that apply a step launched ahead (idle plain decoding)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="the methods' engines of a batch size decode a step each in turn (a drifting "
        "machine's speed then hits them alike); their guards' wall clocks include the others' "
        "steps, so with auto add --verify-device-scale 3 (the oracle only, or on the GPU)",
    )
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    if args.interleave and args.model and not torch.cuda.is_available():
        parser.error(
            "--interleave with --model needs the GPU (on the CPU the engines share one "
            "forward meter)"
        )
    torch.set_num_threads(1)  # tiny CPU tensors: keep them off torch's thread pool
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}; async scheduling "
        f"{'on' if args.async_scheduling else 'off'}, device wait x{args.device_ms_scale} "
        f"(verification steps x{args.device_ms_scale * args.verify_device_scale})"
    )
    rows = []
    configs = list(method_configs(args).items())
    groups = [configs] if args.interleave else [[config] for config in configs]
    repeats = 1 if args.profile else args.repeats
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for group in groups:
            results = defaultdict(list)
            for _ in range(repeats):
                for result in measure(args, group, batch):
                    results[result[0].method].append(result)
                _free_device_memory()
            for name, _ in group:
                row, profiler = min(results[name], key=lambda result: result[0].mean_host_ms)
                rows.append(row)
                _print_row(row, profiler, args.profile)
    if args.json:
        _write_json(args, rows)


def _print_row(row: Row, profiler, top: int) -> None:
    print(HEADER)
    print(row.line())
    _print_parts(row)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)


def _free_device_memory() -> None:
    """--model on the GPU: the last engine's KV cache and graphs go before the next one's."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def _write_json(args, rows: list[Row]) -> None:
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "args": vars(args),
        "rows": [
            {
                "method": row.method,
                "batch": row.batch,
                "steps": row.steps,
                "spec_steps": row.spec_steps,
                "tokens": row.tokens,
                "host_ms_mean": row.mean_host_ms,
                "host_ms_median": statistics.median(row.host_ms),
                "spec_host_ms_mean": _mean(row.spec_host_ms),
                "plain_host_ms_mean": _mean(row.plain_host_ms),
                "parts_ms_per_step": {k: v / row.steps for k, v in row.parts_ms.items()},
                "spec_stats": row.spec_stats,
            }
            for row in rows
        ],
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)


def _print_parts(row: Row) -> None:
    if row.parts_ms:
        parts = ", ".join(
            f"{name.strip()} {value / row.steps:.3f}"
            for name, value in sorted(row.parts_ms.items())
        )
        print(f"        per step (ms): {parts}")
    stats = row.spec_stats
    if stats.get("num_drafts"):
        print(
            f"        drafts {stats['num_drafts']:.0f}, drafted {stats['num_draft_tokens']:.0f}, "
            f"accepted {stats['num_accepted_tokens']:.0f}, "
            f"padding {stats['num_padding_tokens']:.0f}, "
            f"uniform steps {stats['num_uniform_verify_steps']:.0f}, "
            f"cost-off {stats['num_cost_off_steps']:.0f}"
        )


if __name__ == "__main__":
    main()
