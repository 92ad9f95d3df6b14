"""The measured guard's books against the wall clock: what its samples leave out.

    python benchmarks/guard_accounting.py                    # CPU: oracle model, simulated H200
    python benchmarks/guard_accounting.py --batch-sizes 1,8 --json guard_accounting.json
    python benchmarks/guard_accounting.py --model gossamer/models/gpt-oss-mini   # a real model
    python benchmarks/guard_accounting.py --max-tokens 256 --rounds 6   # a stream of new batches

The measured guard (gossamer/spec/guard.py) keeps, per batch bucket, the faster of speculating
and plain decoding by the wall time of engine steps (from one Speculator.after_step to the next)
and the tokens each request got. This script runs a guarded engine and asks where the time of the
run went: every step is one "cycle" of the guard (Speculator.cycle_observer), either a sample of
its mode or left out for a reason (the verdicts of gossamer/spec/speculator.py and guard.py:
"window warm-up", "no mode", "ends an overlap", "prompt chunk"; samples may be "capped" as
stalls). Cycles tile the run: "where the time went" adds up to the run's wall time (the last row
is the time after the last after_step). "by batch size" is the time and tokens at each batch size
and mode: a closed batch whose requests progress unevenly ends in a tail of small batches. Then,
per bucket and mode, it sets the guard's view (its last complete window: tokens per second of the
batch, and what a request waited per token, the root mean square over requests that the guard
compares) beside the guard's samples in this run and every cycle that ran in that mode, left-out
ones included. A mode whose left-out cycles cost more per token than its samples is flattered by
the guard; one whose samples run slower than its stretches is wronged. A "none" run (no
speculator) on the same workload gives the plain baseline (its decode steps alone too).

Workloads, as `spec_host_cost.py`: by default an oracle model (every fed token's next token is
looked up in its request's predetermined text, so that n-gram and suffix drafts are accepted part
of the way) whose forward runs on a simulated asynchronous device: each step occupies the device
for gpt-oss-mini's H200 step time (`--device-ms-scale` times it) after the previous one, and the
host waits only where the engine reads results back (the synchronous path after runner.run, an
overlapped step's tokens). So overlapped plain steps hide host time as on the GPU. `--model PATH`:
a real model with `spec_decode.py e2e`'s workload (its chat prompts, greedy, a warm-up batch on
other prompts first) and engine settings (CUDA graphs and start-up calibration on the GPU).

The spec config is `--spec-config` (JSON; default: "auto" with its default guard; the oracle gives
auto the H200's step costs of gpt-oss-mini as its cost table, as the GPU would time them).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_host_cost import (  # noqa: E402
    MINI_STEP_MS,
    DeviceTime,
    OracleModel,
    build_engine,
    load_once,
    phrase_set,
    text_tokens,
)

from gossamer.engine.core import EngineConfig, EngineCore  # noqa: E402
from gossamer.sampling_params import SamplingParams  # noqa: E402
from gossamer.spec.config import SpecConfig, parse_spec_config  # noqa: E402
from gossamer.spec.guard import SAMPLED, Window, bucket_of  # noqa: E402
from gossamer.spec.speculator import PROMPT_CHUNK, GuardCycle  # noqa: E402

GiB = 1 << 30
AFTER = "after the last after_step"
SPIN_S = 2e-4  # the device wait's last stretch, spun


# ---- the simulated device ------------------------------------------------------------------------


class FakeDevice:
    """A device timeline: work runs after the work queued before it; the host waits (spinning,
    as a CUDA sync does) only when it reads a result."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def launch(self, seconds: float) -> float:
        """Queue `seconds` of work; returns when it is done."""
        self.free_at = max(time.perf_counter(), self.free_at) + seconds
        return self.free_at

    @staticmethod
    def wait_until(moment: float) -> None:
        """Sleeps, then spins the last SPIN_S (a sleep overshoots by tens of microseconds; a
        process that only spins is the first the OS preempts on a shared machine)."""
        left = moment - time.perf_counter()
        if left > SPIN_S:
            time.sleep(left - SPIN_S)
        while time.perf_counter() < moment:
            pass


class DeviceOracle(OracleModel):
    """The oracle model, its step time spent on a FakeDevice instead of a sleep on the host."""

    def __init__(self, vocab: int, max_model_len: int, device_time: DeviceTime) -> None:
        super().__init__(vocab, max_model_len, device_time)
        self.timeline = FakeDevice()
        self.done_at = 0.0  # when the last launched step's results exist

    def _wait(self, seconds: float) -> None:
        self.done_at = self.timeline.launch(seconds)


def attach_device(engine: EngineCore, model: DeviceOracle) -> None:
    """The engine's reads of results wait for the device: a synchronous step's logits right
    after runner.run, an overlapped step's tokens when they are applied."""
    run, launch = engine.runner.run, engine._launch
    launching = [False]

    def run_then_read(seqs, **options):
        logits = run(seqs, **options)
        if not launching[0]:
            model.timeline.wait_until(model.done_at)
        return logits

    def launch_ahead(scheduled, device_input_ids=None):
        launching[0] = True
        try:
            step = launch(scheduled, device_input_ids)
        finally:
            launching[0] = False
        done, read = model.done_at, step.sampled_token_ids

        def read_when_done(while_waiting=None):
            # as InFlightStep does on the GPU: deferred work until the step is done
            while while_waiting is not None and time.perf_counter() < done and while_waiting():
                pass
            model.timeline.wait_until(done)
            return read()

        step.sampled_token_ids = read_when_done
        return step

    engine.runner.run = run_then_read
    engine._launch = launch_ahead


# ---- engines -------------------------------------------------------------------------------------


def oracle_texts(args, batch: int, seed: int) -> list[list[int]]:
    """One text per request: a prompt of phrases (now and then a copy of an earlier passage,
    `--copy-prob`), then what the request will decode, which copies earlier passages with the
    request's own probability (`--output-copy-probs`, in turn): as e2e's chat prompts, a rewrite
    of the prompt accepts most drafts, a story few. All draw on one set of phrases."""
    phrases = phrase_set(args)
    rng = random.Random(seed)
    length = args.prompt_tokens + args.max_tokens + 2 * args.k + 2
    texts = []
    for index in range(batch):
        prompt = text_tokens(args.prompt_tokens, rng, phrases, args.copy_prob)
        copy_prob = args.output_copy_probs[index % len(args.output_copy_probs)]
        texts.append(text_tokens(length, rng, phrases, copy_prob, start=prompt))
    return texts


def oracle_engine(args, spec: SpecConfig | None, batch: int):
    """(engine, prompts(seed)) over the oracle on the simulated device."""
    device_time = DeviceTime(MINI_STEP_MS, args.device_ms_scale, max_query=1 + 2 * args.k)
    model = DeviceOracle(args.vocab, args.max_model_len, device_time)
    if spec is not None and spec.method == "auto" and spec.cost_table is None:
        table = {str(b): {str(k): ms for k, ms in row.items()} for b, row in MINI_STEP_MS.items()}
        spec = replace(spec, cost_table=table)  # as its engine would time it on the H200
    engine = build_engine(args, spec, model, batch)
    attach_device(engine, model)

    def prompts(seed: int) -> list[list[int]]:
        texts = oracle_texts(args, batch, seed)
        model.set_texts(texts)
        return [text[: args.prompt_tokens] for text in texts]

    return engine, prompts


def real_model_engine(args, spec: SpecConfig | None, batch: int):
    """(engine, prompts(seed)) as `spec_decode.py e2e` builds them."""
    from spec_decode import workload

    loaded, device = load_once(args)
    config = EngineConfig(
        max_num_seqs=batch,
        kv_cache_memory=int(args.kv_cache_gib * GiB),
        speculative_config=spec,
        cuda_graphs=device == "cuda",
        async_scheduling=args.async_scheduling,
    )
    engine = EngineCore(loaded.model, None, config)
    return engine, lambda seed: workload(loaded, batch, seed)


# ---- one run -------------------------------------------------------------------------------------


@dataclass
class Run:
    """One timed batch: its wall time and tokens, its engine steps, the guard's cycles."""

    start: float = 0.0
    end: float = 0.0
    tokens: int = 0
    decode_seconds: float = 0.0  # engine steps that computed no prompt chunk
    decode_tokens: int = 0
    cycles: list[GuardCycle] = field(default_factory=list)
    guard_stats: dict[str, float] = field(default_factory=dict)
    finished_at: list[float] = field(default_factory=list)  # seconds into the run, per request

    @property
    def seconds(self) -> float:
        return self.end - self.start


def run_batch(engine: EngineCore, prompts: list[list[int]], max_tokens: int) -> Run:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{index}", prompt, params)
    run = Run()
    speculator = engine.speculator
    if speculator is not None:
        speculator.cycle_observer = run.cycles.append
    _sync()
    run.start = time.perf_counter()
    while engine.has_unfinished_requests():
        prompt_before, start = engine.stats.prompt_tokens, time.perf_counter()
        outputs = engine.step()
        tokens = sum(len(out.new_token_ids) for out in outputs)
        run.tokens += tokens
        now = time.perf_counter()
        run.finished_at += [now - run.start for out in outputs if out.finished]
        if engine.stats.prompt_tokens == prompt_before:
            run.decode_seconds += time.perf_counter() - start
            run.decode_tokens += tokens
    _sync()  # an overlapped step may still run for a request that ended (as e2e's end)
    run.end = time.perf_counter()
    if speculator is not None:
        speculator.cycle_observer = None
        run.guard_stats = {k: v for k, v in speculator.stats().items() if k.startswith("guard_")}
    return run


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(args, spec: SpecConfig | None, batch: int) -> Run:
    """A warm-up batch (the guard learns there, as in spec_decode.py e2e), then the timed one."""
    return measure_interleaved(args, [spec], batch, rounds=1)[0][0]


def measure_interleaved(
    args, specs: list[SpecConfig | None], batch: int, rounds: int
) -> list[list[Run]]:
    """One engine per spec, built and warmed up side by side; then `rounds` timed batches of new
    requests on each (as a server sees them: each new batch's requests need their indexes built
    to speculate), the engines taking turns in alternating order (A B, B A, ...). The H200
    machine's host drifts over seconds (session 12: plain decoding at batch 8 on mini went from
    0.27 to 0.65 ms a step and back within a few rounds), so only runs made at nearly the same
    moment compare. Returns each engine's runs."""
    build = real_model_engine if args.model else oracle_engine
    engines = [build(args, spec, batch) for spec in specs]
    for engine, prompts in engines:
        run_batch(engine, prompts(1000 + batch), args.max_tokens)
    runs: list[list[Run]] = [[] for _ in engines]
    for round_ in range(rounds):
        order = list(range(len(engines)))
        for index in order if round_ % 2 == 0 else order[::-1]:
            engine, prompts = engines[index]
            runs[index].append(run_batch(engine, prompts(batch + 100 * round_), args.max_tokens))
    return runs


# ---- the books -----------------------------------------------------------------------------------


def tiled(run: Run) -> list[tuple[GuardCycle, float]]:
    """Each cycle with its wall time; a cycle whose start is unknown starts where the previous
    one ended (both are after_step starts), the first at the run's start (at the latest)."""
    out, previous = [], run.start
    for cycle in run.cycles:
        start = max(cycle.start if cycle.start is not None else previous, run.start)
        out.append((cycle, cycle.end - start))
        previous = cycle.end
    return out


def ran_as(cycle: GuardCycle) -> str:
    """The mode a cycle's time belongs to: the guard's, else what the step did."""
    if cycle.verdict == PROMPT_CHUNK:
        return "prompt"
    mode = cycle.mode if cycle.mode is not None else cycle.drafted
    return "spec" if mode else "plain"


@dataclass
class Books:
    """Tallies (gossamer/spec/guard.py's Window: wall time, tokens, per request time and tokens)
    of the run's cycles: by verdict (and the time after the last one), and per "b{bucket} {mode}"
    those the guard sampled, all of them, and the left-out ones by verdict."""

    run_seconds: float
    run_tokens: int
    by_verdict: dict[str, Window]
    sampled: dict[str, Window]
    delivered: dict[str, Window]
    left_out: dict[str, dict[str, Window]]
    guard_stats: dict[str, float]


def books(run: Run) -> Books:
    by_verdict: dict[str, Window] = defaultdict(Window)
    sampled: dict[str, Window] = defaultdict(Window)
    delivered: dict[str, Window] = defaultdict(Window)
    left_out: dict[str, dict[str, Window]] = defaultdict(lambda: defaultdict(Window))
    cycles = tiled(run)
    for cycle, seconds in cycles:
        tokens = cycle.request_tokens
        by_verdict[cycle.verdict].add(seconds, tokens)
        key = f"b{bucket_of(cycle.batch)} {ran_as(cycle)}"
        delivered[key].add(seconds, tokens)
        if cycle.verdict.startswith(SAMPLED):  # sampled, capped or built an index
            sampled[key].add(seconds, tokens)
        else:
            left_out[key][cycle.verdict].add(seconds, tokens)
    last_start = cycles[-1][0].end if cycles else run.end
    by_verdict[AFTER].add(run.end - last_start, {})
    return Books(
        run.seconds,
        run.tokens,
        dict(by_verdict),
        dict(sampled),
        dict(delivered),
        {key: dict(value) for key, value in left_out.items()},
        run.guard_stats,
    )


def print_books(name: str, batch: int, run: Run, account: Books, baseline: Run | None) -> None:
    speed = run.tokens / run.seconds
    vs = f", {speed / (baseline.tokens / baseline.seconds):.2f}x of none" if baseline else ""
    print(
        f"\n== {name} at batch {batch}: {run.tokens} tokens in {1e3 * run.seconds:.1f} ms, "
        f"{speed:,.0f} tok/s{vs}"
    )
    if baseline is not None:
        print(
            f"   none: {1e3 * baseline.seconds:.1f} ms; its decode steps alone "
            f"{baseline.decode_tokens / baseline.decode_seconds:,.0f} tok/s, "
            f"{1e3 * baseline.decode_seconds / baseline.decode_tokens * batch:.3f} ms a token"
        )
    print_verdicts(account)
    print_batch_profile(run)
    print_finishes(run, baseline)
    print_modes(account)


def print_verdicts(account: Books) -> None:
    print(f"   {'where the time went':32s} {'cycles':>6s} {'ms':>9s} {'share':>6s} {'tokens':>7s}")
    tallied = 0.0
    for verdict, tally in sorted(account.by_verdict.items(), key=lambda kv: -kv[1].seconds):
        tallied += tally.seconds
        share = 100 * tally.seconds / account.run_seconds
        ms, tokens = 1e3 * tally.seconds, int(tally.tokens)
        print(f"   {verdict:32s} {tally.num_steps:6d} {ms:9.2f} {share:5.1f}% {tokens:7d}")
    print(
        f"   {'sum (the run: %.2f ms)' % (1e3 * account.run_seconds):32s} {'':6s} {1e3 * tallied:9.2f}"
    )


def print_modes(account: Books) -> None:
    """Per bucket and mode: the guard's last complete window (what it decides with), its samples
    in this run, and every cycle that ran in the mode (tok/s of the batch; ms a request waited
    per token, the guard's measure), and what of those it left out."""
    print(
        f"   {'bucket mode':12s} {'guard: tok/s':>12s} {'ms/tok':>7s} | {'samples':>7s} "
        f"{'tok/s':>8s} {'ms/tok':>7s} | {'cycles':>6s} {'ms':>8s} {'tok/s':>8s} {'ms/tok':>7s}"
        " | left out (cycles, ms)"
    )
    for key in sorted(_modes_seen(account), key=_bucket_order):
        bucket, mode = key.split()
        guard_rate = account.guard_stats.get(f"guard_{bucket}_{mode}_tokens_per_s", math.nan)
        guard_wait = account.guard_stats.get(f"guard_{bucket}_{mode}_ms_per_token", math.nan)
        sampled = account.sampled.get(key, Window())
        delivered = account.delivered.get(key, Window())
        left = ", ".join(
            f"{verdict} {t.num_steps} {1e3 * t.seconds:.2f}"
            for verdict, t in sorted(account.left_out.get(key, {}).items())
        )
        print(
            f"   {key:12s} {guard_rate:12,.0f} {guard_wait:7.3f} | {sampled.num_steps:7d} "
            f"{sampled.tokens_per_s:8,.0f} {_ms(sampled):7.3f} | {delivered.num_steps:6d} "
            f"{1e3 * delivered.seconds:8.2f} {delivered.tokens_per_s:8,.0f} {_ms(delivered):7.3f}"
            f" | {left}"
        )


def _modes_seen(account: Books) -> set[str]:
    """ "b{bucket} {mode}" of the cycles that ran, and of the guard's last windows (a mode may
    have run only in the warm-up batch)."""
    seen = {key for key in account.delivered if not key.endswith("prompt")}
    for name, value in account.guard_stats.items():
        bucket, _, rest = name.removeprefix("guard_").partition("_")
        mode = rest.partition("_")[0]
        if mode in ("spec", "plain") and value:
            seen.add(f"{bucket} {mode}")
    return seen


def _ms(window: Window) -> float:
    wait = window.seconds_per_token
    return 1e3 * wait if wait < math.inf else math.nan


def batch_profile(run: Run) -> dict[int, dict[str, Window]]:
    """Per batch size and mode ("spec", "plain"; prompt steps apart): the cycles, their wall time
    and tokens. A closed batch whose requests progress unevenly ends in a tail of small batches."""
    profile: dict[int, dict[str, Window]] = defaultdict(lambda: defaultdict(Window))
    for cycle, seconds in tiled(run):
        profile[cycle.batch][ran_as(cycle)].add(seconds, cycle.request_tokens)
    return {batch: dict(modes) for batch, modes in profile.items()}


def print_batch_profile(run: Run) -> None:
    parts = []
    for batch, modes in sorted(batch_profile(run).items(), reverse=True):
        for mode, tally in sorted(modes.items()):
            ms, tokens = 1e3 * tally.seconds, int(tally.tokens)
            parts.append(f"{batch} {mode}: {tally.num_steps} steps {ms:.1f} ms {tokens} tok")
    print("   by batch size: " + "; ".join(parts))


def print_finishes(run: Run, baseline: Run | None) -> None:
    """When the requests finished (ms into the run, in order): a closed batch lasts as long as
    its slowest request, so speculation that speeds most requests but slows one loses the run."""
    for name, timed in (("none", baseline), ("guarded", run)):
        if timed is not None and timed.finished_at:
            ends = " ".join(f"{1e3 * t:.0f}" for t in sorted(timed.finished_at))
            print(f"   requests finished, {name} (ms): {ends}")


def print_rounds(batch: int, runs: list[Run], baselines: list[Run]) -> None:
    """Rounds of new batches: each round's speed against none's in the same round, their median,
    and the ratio of the medians."""
    guarded = [run.tokens / run.seconds for run in runs]
    plain = [run.tokens / run.seconds for run in baselines]
    ratios = [g / p for g, p in zip(guarded, plain, strict=True)]
    listed = " ".join(f"{ratio:.2f}x" for ratio in ratios)
    median = statistics.median(guarded) / statistics.median(plain)
    print(
        f"\n== batch {batch}, {len(runs)} rounds: guarded/none {listed}; median of the rounds "
        f"{statistics.median(ratios):.2f}x, of the speeds {median:.2f}x"
    )


def _bucket_order(key: str) -> tuple[int, str]:
    bucket, mode = key.split()
    return int(bucket[1:]), mode


# ---- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # tiny CPU tensors (the oracle): keep them off torch's thread pool
    spec = parse_spec_config(args.spec_config)
    workload = f"--model {args.model}" if args.model else f"oracle, device x{args.device_ms_scale}"
    print(
        f"python {platform.python_version()}, torch {torch.__version__}; {workload}; async "
        f"scheduling {'on' if args.async_scheduling else 'off'}; spec {args.spec_config}"
    )
    results = []
    for batch in args.batch_sizes:
        for repeat in range(args.repeats):
            if args.baseline:  # none's engine beside the guarded one, taking turns
                baselines, runs = measure_interleaved(args, [None, spec], batch, args.rounds)
            else:
                baselines, (runs,) = None, measure_interleaved(args, [spec], batch, args.rounds)
            for index, run in enumerate(runs):
                baseline = baselines[index] if baselines else None
                account = books(run)
                name = f"guarded (run {repeat + 1}" + (
                    f", round {index + 1})" if args.rounds > 1 else ")"
                )
                print_books(name, batch, run, account, baseline)
                results.append(_result(batch, repeat, run, account, baseline) | {"round": index})
            if baselines and args.rounds > 1:
                print_rounds(batch, runs, baselines)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "args": vars(args)}
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
        Path(args.json).write_text(json.dumps(meta | {"runs": results}, indent=2, default=str))


def _result(batch: int, repeat: int, run: Run, account: Books, baseline: Run | None) -> dict:
    result = {"batch": batch, "repeat": repeat, "seconds": run.seconds, "tokens": run.tokens}
    result["finished_at"] = sorted(run.finished_at)
    result["guard_stats"] = account.guard_stats
    result["by_verdict"] = _summaries(account.by_verdict)
    result["sampled"] = _summaries(account.sampled)
    result["delivered"] = _summaries(account.delivered)
    result["left_out"] = {key: _summaries(value) for key, value in account.left_out.items()}
    result["by_batch"] = {
        str(size): _summaries(modes) for size, modes in batch_profile(run).items()
    }
    if baseline is not None:
        result["none"] = {
            "seconds": baseline.seconds,
            "tokens": baseline.tokens,
            "decode_seconds": baseline.decode_seconds,
            "decode_tokens": baseline.decode_tokens,
            "finished_at": sorted(baseline.finished_at),
        }
    return result


def _summaries(windows: dict[str, Window]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "cycles": window.num_steps,
            "ms": 1e3 * window.seconds,
            "tokens": window.tokens,
            "tokens_per_s": window.tokens_per_s,
            "ms_per_token": _ms(window),
        }
        for name, window in windows.items()
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec-config", default='{"method": "auto"}')
    parser.add_argument("--batch-sizes", default="8")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="guarded runs per batch size")
    parser.add_argument(
        "--rounds", type=int, default=1, help="timed batches of new requests per engine"
    )
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", default=None)
    real = parser.add_argument_group("a real model")
    real.add_argument("--model", default=None, help="checkpoint folder or preset (else: oracle)")
    real.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    real.add_argument("--kv-cache-gib", type=float, default=8.0)
    oracle = parser.add_argument_group("the oracle (spec_host_cost.py's)")
    oracle.add_argument("--device-ms-scale", type=float, default=1.0)
    oracle.add_argument("--prompt-tokens", type=int, default=1024)
    oracle.add_argument("--k", type=int, default=4, help="max_query of the device time table")
    oracle.add_argument("--vocab", type=int, default=1000)
    oracle.add_argument("--phrases", type=int, default=300)
    oracle.add_argument("--copy-prob", type=float, default=0.5, help="in the prompts")
    oracle.add_argument(
        "--output-copy-probs",
        default="0.95,0.6,0.1",
        help="in what the requests decode, per request in turn (a rewrite, a summary, a story)",
    )
    oracle.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.output_copy_probs = [float(p) for p in args.output_copy_probs.split(",")]
    return args


if __name__ == "__main__":
    main()
