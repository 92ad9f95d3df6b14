"""End-to-end engine throughput (issue #8): output tok/s at concurrency C, 1k tokens in, 1k out.

    python benchmarks/throughput.py                               # 120b and 20b, C = 16, 64, 256
    python benchmarks/throughput.py --models gpt-oss-120b --json throughput_120b.json
    python benchmarks/throughput.py --smoke                       # CPU-sized: built-in mini model
    python benchmarks/throughput.py --models gpt-oss-120b --concurrency 1 --no-async-scheduling
    python benchmarks/throughput.py --models gpt-oss-120b --concurrency 64 --requests-per-user 4

The real engine (EngineCore with its default scheduler, CUDA graphs and prefix caching) on one
GPU, dummy weights. By default concurrency C is one batch of C requests all submitted at t = 0
(no refill of finished slots; --requests-per-user below): each request is --input-len random
token ids, distinct from every other prompt of the run (no prefix-cache hits; the count of hit
tokens is reported) and asks for exactly --output-len greedy tokens with EOS ignored. Before the
first C a short warm-up batch (other prompts) compiles the prefill shapes; the decode graphs are
captured when the engine starts.

--requests-per-user N (N > 1) runs a closed loop instead, as serving benchmarks with a maximum
concurrency do (e.g. vLLM's `bench serve --max-concurrency C --num-prompts N*C`): C users each
submit their next request as soon as the previous one finishes, N requests each, so new prompts'
prefills share steps with the others' decodes. Time to first token is then counted from each
request's own submission.

Per C: wall time from submission to the last token, output tok/s, mean time to first token (queue
and prefill of the whole batch included) and time per output token after it, preemptions, and
how the wall time splits between prefill steps (any prompt tokens computed, decodes riding along)
and pure decode steps. Beside the mean decode step stands its floor at batch C from
decode_speed.step_bytes (weights the batch touches + KV at the mean context) over the copy
bandwidth measured in this run. The engine times each step on the host: a step ends when the
sampled tokens reach the host, so a step's wall time is its cost.

By default (as `gossamer serve`) the engine runs overlapped decode steps (--no-async-scheduling:
synchronous; gossamer/engine/overlap.py): the
host applies step N's tokens while the GPU runs step N + 1, so a decode step's wall time is the
cadence of steps, and `overlapped_steps` counts the steps launched that way. Compare a run with
and without it at the same C.

KV cache: --kv-cache-gib, or the engine's default budget (what 90% of the GPU leaves after the
weights, less 4 GiB for activations). A row says whether the cache held C requests of
input + output tokens at once; when it did not, preemptions follow and the row says so. For
gpt-oss-120b (about 65 GB of weights) the default budget on a 141 GB H200 holds about 200k blocks of
16 tokens, three times what C = 256 x 2k needs; on an 80 GB H100 it holds about 22k blocks, enough
for C = 64 but not for C = 256.

Expected device time on an H200 (predicted from the decode-step and prefill numbers in
BENCHMARKS.md, not yet measured): gpt-oss-120b about 16 s at C = 16, 60 s at C = 64 and 95 s at
C = 256 (about 1k decode steps of ~65 ms plus ~25 s of prefill), plus about 1 min of loading,
graph capture and warm-up: 3 to 4 min. gpt-oss-20b: about 70 s for all C plus loading, about
2 min. Both models in one call come near 6 min; split them with --models to stay well inside the
device's 10-minute limit per command.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import step_bytes  # noqa: E402
from timing import copy_bandwidth  # noqa: E402

from gossamer.engine.core import KV_CACHE_DTYPES, EngineConfig, EngineCore  # noqa: E402
from gossamer.model.loader import load_model  # noqa: E402
from gossamer.models import default_model_path  # noqa: E402
from gossamer.sampling_params import SamplingParams  # noqa: E402

GiB = 1 << 30
MODE = "batch: C requests submitted at t=0, no refill"
CLOSED_LOOP = "closed loop: C users, each submits its next request when one finishes"
WARMUP_OUTPUT_TOKENS = 16
# --smoke: the built-in model, lengths that run in about a second on a CPU, and a 64 MiB cache
# (the CPU default of 1 GiB takes longer to allocate than the run)
SMOKE = {"concurrency": "2,4", "input_len": 24, "output_len": 6, "kv_cache_gib": 1 / 16}


@dataclass
class Row:
    model: str
    concurrency: int
    mode: str
    input_len: int
    output_len: int
    wall_s: float
    output_tokens: int
    output_tok_per_s: float
    mean_ttft_ms: float
    max_ttft_ms: float
    mean_tpot_ms: float
    preemptions: int
    prefix_cache_hit_tokens: int
    prefill_steps: int  # steps that computed prompt tokens (decodes may ride along)
    decode_steps: int
    prefill_s: float
    decode_s: float
    prefill_share: float  # of the summed step time
    decode_share: float
    mean_decode_step_ms: float
    slowest_step_ms: float  # a Triton compile inside the timed window shows here
    floor_ms: float | None  # one decode step at batch C, mean context; None without a GPU
    floor_share: float | None  # floor / mean decode step
    kv_blocks: int  # usable blocks of the engine's cache
    kv_blocks_needed: int  # C requests of input + output tokens at their peak, at once
    kv_fits: bool
    peak_kv_usage: float
    runner_steps: dict[str, int] = field(default_factory=dict)  # graph / eager reasons
    async_scheduling: bool = False
    overlapped_steps: int = 0  # launched before the previous step's tokens reached the host

    def line(self) -> str:
        floor = (
            f"{self.floor_ms:8.2f} {100 * self.floor_share:5.0f}%"
            if self.floor_share is not None
            else " " * 14
        )
        return (
            f"{self.model:13s} {self.concurrency:5d} {self.wall_s:8.2f} "
            f"{self.output_tok_per_s:9.1f} {self.mean_ttft_ms:9.1f} {self.mean_tpot_ms:8.2f} "
            f"{self.preemptions:5d} {100 * self.prefill_share:5.1f}% {100 * self.decode_share:5.1f}% "
            f"{self.mean_decode_step_ms:8.2f} {floor} {self.slowest_step_ms:8.1f}"
            f"{'' if self.kv_fits else '  KV too small'}"
            f"{f'  overlapped {self.overlapped_steps}' if self.async_scheduling else ''}"
        )


HEADER = (
    "model             C   wall_s  out_tok/s   ttft_ms  tpot_ms  preem prefill decode "
    "decode_ms floor_ms %floor maxstep"
)


@dataclass
class StepLog:
    """What one batch did, step by step, in seconds from its submission."""

    step_seconds: list[float] = field(default_factory=list)
    step_is_prefill: list[bool] = field(default_factory=list)
    submitted: dict[str, float] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    last_token: dict[str, float] = field(default_factory=dict)
    tokens: Counter[str] = field(default_factory=Counter)
    peak_kv_usage: float = 0.0

    def seconds(self, prefill: bool) -> float:
        """Time in the prefill steps, or in the pure decode steps."""
        pairs = zip(self.step_seconds, self.step_is_prefill, strict=True)
        return sum(seconds for seconds, is_prefill in pairs if is_prefill == prefill)

    def ttft(self) -> list[float]:
        """Seconds from each request's submission to its first token."""
        return [first - self.submitted[rid] for rid, first in self.first_token.items()]


def random_prompts(generator: torch.Generator, count: int, length: int, vocab: int) -> list:
    """Random token ids: two prompts sharing even one 16-token block is vanishingly unlikely, and
    every batch draws new ones from the same generator, so no prefix-cache hits."""
    return torch.randint(0, vocab, (count, length), generator=generator).tolist()


def run_batch(
    engine: EngineCore, prompts: list[list[int]], output_len: int, users: int | None = None
) -> StepLog:
    """Step the engine until every prompt is done: all submitted at once, or with `users` at a
    time (a closed loop: a finished request's user submits the next prompt before the next step)."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    log = StepLog()
    waiting = iter(enumerate(prompts))
    tag = time.monotonic_ns()

    def submit(count: int, now: float) -> None:
        for i, prompt in itertools.islice(waiting, count):
            request_id = f"t{tag}-{i}"
            engine.add_request(request_id, prompt, params)
            log.submitted[request_id] = now - start

    _sync()
    start = previous = time.perf_counter()
    submit(users or len(prompts), start)
    while engine.has_unfinished_requests():
        prompt_tokens = engine.stats.prompt_tokens
        outputs = engine.step()
        now = time.perf_counter()
        log.step_seconds.append(now - previous)
        log.step_is_prefill.append(engine.stats.prompt_tokens > prompt_tokens)
        log.peak_kv_usage = max(log.peak_kv_usage, engine.stats.kv_cache_usage)
        previous = now
        for output in outputs:
            if output.new_token_ids:
                log.first_token.setdefault(output.request_id, now - start)
                log.last_token[output.request_id] = now - start
                log.tokens[output.request_id] += len(output.new_token_ids)
        submit(sum(output.finished for output in outputs), now)
    return log


def kv_capacity(engine: EngineCore, concurrency: int, tokens_per_request: int) -> tuple[int, int]:
    """(usable blocks, blocks that `concurrency` requests of that many tokens hold at their peak)."""
    manager = engine.kv_cache_manager
    per_request = manager.num_blocks_needed(
        tokens_per_request, engine.config.max_num_batched_tokens
    )
    return engine.num_blocks - 1, concurrency * per_request  # block 0 is the null block


def measure(
    engine: EngineCore,
    name: str,
    prompts: list[list[int]],
    args,
    bandwidth: float | None,
    concurrency: int | None = None,
) -> Row:
    """One row: `prompts` all at once, or `concurrency` users working through them in turn."""
    concurrency, stats = concurrency or len(prompts), engine.stats
    preemptions, hits, modes = stats.num_preemptions, stats.prefix_cache_hits, _step_modes(engine)
    overlapped = engine.num_overlapped_steps
    log = run_batch(engine, prompts, args.output_len, concurrency)
    modes = _step_modes(engine) - modes
    prefill_s, decode_s = log.seconds(prefill=True), log.seconds(prefill=False)
    decode_steps = log.step_is_prefill.count(False)
    mean_decode = decode_s / max(decode_steps, 1)
    floor = None
    if bandwidth:  # the mean context of the decode steps
        context = args.input_len + args.output_len // 2
        kv_bytes = engine.runner.kv_cache.element_size()
        floor = step_bytes(engine.model_config, concurrency, context, kv_bytes) / bandwidth
    kv_blocks, kv_needed = kv_capacity(engine, concurrency, args.input_len + args.output_len)
    wall, tokens = max(log.last_token.values()), sum(log.tokens.values())
    return Row(
        model=name,
        concurrency=concurrency,
        mode=MODE if concurrency == len(prompts) else CLOSED_LOOP,
        input_len=args.input_len,
        output_len=args.output_len,
        wall_s=wall,
        output_tokens=tokens,
        output_tok_per_s=tokens / wall,
        mean_ttft_ms=1e3 * statistics.mean(log.ttft()),
        max_ttft_ms=1e3 * max(log.ttft()),
        mean_tpot_ms=1e3 * statistics.mean(time_per_output_token(log)),
        preemptions=stats.num_preemptions - preemptions,
        prefix_cache_hit_tokens=stats.prefix_cache_hits - hits,
        prefill_steps=len(log.step_seconds) - decode_steps,
        decode_steps=decode_steps,
        prefill_s=prefill_s,
        decode_s=decode_s,
        prefill_share=prefill_s / (prefill_s + decode_s),
        decode_share=decode_s / (prefill_s + decode_s),
        mean_decode_step_ms=1e3 * mean_decode,
        slowest_step_ms=1e3 * max(log.step_seconds),
        floor_ms=1e3 * floor if floor else None,
        floor_share=floor / mean_decode if floor and decode_steps else None,
        kv_blocks=kv_blocks,
        kv_blocks_needed=kv_needed,
        kv_fits=kv_needed <= kv_blocks,
        peak_kv_usage=log.peak_kv_usage,
        runner_steps=dict(modes),
        async_scheduling=engine.config.async_scheduling,
        overlapped_steps=engine.num_overlapped_steps - overlapped,
    )


def time_per_output_token(log: StepLog) -> list[float]:
    """Per request: seconds between its first and last token over the tokens after the first."""
    return [
        (log.last_token[rid] - log.first_token[rid]) / (count - 1)
        for rid, count in log.tokens.items()
        if count > 1
    ] or [0.0]


def _step_modes(engine: EngineCore) -> Counter[str]:
    """The runner's steps by how they ran (graph replay or the eager reason), if it counts them."""
    return Counter(getattr(engine.runner, "step_modes", {}))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def load_dummy(name: str, max_model_len: int, ops: str = "auto"):
    """Dummy weights: bfloat16 on the GPU, float32 on a CPU (smoke runs)."""
    on_gpu = torch.cuda.is_available()
    return load_model(
        name,
        load_format="dummy",
        dtype="bfloat16" if on_gpu else "float32",
        device="cuda" if on_gpu else "cpu",
        ops=ops,
        max_model_len=max_model_len,
    )


def build_engine(name: str, args: argparse.Namespace) -> EngineCore:
    loaded = load_dummy(name, args.input_len + args.output_len)
    config = EngineConfig(
        # the default scheduler, widened only if a batch would not fit in it at once
        max_num_seqs=max(EngineConfig.max_num_seqs, *args.concurrency),
        kv_cache_memory=int(args.kv_cache_gib * GiB) if args.kv_cache_gib else None,
        cuda_graphs=not args.no_cuda_graphs,
        async_scheduling=args.async_scheduling,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    return EngineCore(loaded.model, None, config)


def describe_memory(engine: EngineCore, args: argparse.Namespace) -> dict:
    """Weights, KV cache and whether the largest C fits at once; printed and kept in the JSON."""
    model = engine.runner.model
    tensors = {t.data_ptr(): t for t in itertools.chain(model.parameters(), model.buffers())}
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    kv = engine.runner.kv_cache
    biggest = max(args.concurrency)
    blocks, needed = kv_capacity(engine, biggest, args.input_len + args.output_len)
    verdict = "fits" if needed <= blocks else "does NOT fit: expect preemptions"
    print(
        f"weights {weights / GiB:.2f} GiB; KV cache {kv.numel() * kv.element_size() / GiB:.2f} GiB"
        f" = {blocks} blocks; C={biggest} x {args.input_len + args.output_len} tokens needs "
        f"{needed}: {verdict}",
        flush=True,
    )
    return {"weights_gib": weights / GiB, "kv_blocks": blocks, "kv_blocks_needed_max_c": needed}


def bench_model(name: str, args: argparse.Namespace, bandwidth: float | None) -> dict:
    label = Path(name).name
    start = time.perf_counter()
    engine = build_engine(name, args)
    memory = describe_memory(engine, args)
    generator = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    warmup = random_prompts(generator, min(args.concurrency), args.input_len, vocab)
    run_batch(engine, warmup, min(args.output_len, WARMUP_OUTPUT_TOKENS))
    print(f"{label}: loaded, captured and warmed up in {time.perf_counter() - start:.1f} s")
    print(HEADER)
    rows = []
    for concurrency in args.concurrency:
        count = concurrency * args.requests_per_user
        prompts = random_prompts(generator, count, args.input_len, vocab)
        rows.append(measure(engine, label, prompts, args, bandwidth, concurrency))
        print(rows[-1].line(), flush=True)
    del engine
    gc.collect()  # free the weights now (cycles too): the next KV budget reads free memory
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"model": label, **memory, "rows": [asdict(row) for row in rows]}


def fill_defaults(args: argparse.Namespace, defaults: dict, smoke: dict) -> None:
    """Options left unset (None) take `defaults`, or with --smoke the `smoke` values on the built-in
    model and one CPU thread (on a small shared CPU more OpenMP threads only contend)."""
    if args.smoke:
        defaults = defaults | smoke
        torch.set_num_threads(1)
        args.models = args.models or str(default_model_path())
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.models = (args.models or "gpt-oss-120b,gpt-oss-20b").split(",")


def run_info(args: argparse.Namespace) -> dict:
    """The head of a result file: when, on what, with which options."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "args": vars(args),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=None, help="default gpt-oss-120b,gpt-oss-20b")
    parser.add_argument("--concurrency", default=None, help="default 16,64,256")
    parser.add_argument("--input-len", type=int, default=None, help="default 1024")
    parser.add_argument("--output-len", type=int, default=None, help="default 1024")
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES])
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument(
        "--requests-per-user",
        type=int,
        default=1,
        help="1 (default): one batch of C requests at t=0; N > 1: a closed loop of C users, "
        "N requests each",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlapped decode steps (the engine's async_scheduling, as `gossamer serve` runs "
        "it by default); --no-async-scheduling: synchronous steps",
    )
    parser.add_argument("--smoke", action="store_true", help="mini model, tiny lengths (CPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    fill_defaults(args, {"concurrency": "16,64,256", "input_len": 1024, "output_len": 1024}, SMOKE)
    args.concurrency = [int(c) for c in str(args.concurrency).split(",")]
    if args.requests_per_user < 1:
        parser.error("--requests-per-user must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    bandwidth = None
    if torch.cuda.is_available():
        bandwidth = copy_bandwidth(gib=4)
        print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s")
    overlap = "on" if args.async_scheduling else "off"
    mode = MODE if args.requests_per_user == 1 else f"{CLOSED_LOOP}, {args.requests_per_user} each"
    print(f"{mode}; {args.input_len} tokens in, {args.output_len} out; async scheduling {overlap}")
    models = [bench_model(name, args, bandwidth) for name in args.models]
    result = {
        **run_info(args),
        "mode": mode,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "models": models,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
