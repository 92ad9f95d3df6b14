"""Speculative decoding on one GPU: what each proposer buys end to end, and what verification costs.

    # 1. per proposer: mean accepted length and end-to-end speedup at batch 1 and 8
    python benchmarks/spec_decode.py e2e --model /ckpt/gpt-oss-120b \\
        --draft /ckpt/gpt-oss-20b --eagle3 /ckpt/gpt-oss-120b-eagle3 --json spec_e2e.json

    # 2. the cost of one verification step (k drafts + 1 token per request) for k = 0..7,
    #    gpt-oss-120b with dummy weights, through ModelRunner with num_logits = k + 1; --cost-table
    #    also writes the step-cost table the cost-aware "auto" reads:
    #    --speculative-config '{"method": "auto", "cost_table": "spec_costs.json"}'
    python benchmarks/spec_decode.py verify-cost --model gpt-oss-120b --load-format dummy \\
        --batch-sizes 1,8 --context 1024 --json spec_verify.json --cost-table spec_costs.json

    # 3. (CPU) the suffix proposer's per-request index: its build time against the prompt length,
    #    next to the trie of every substring it used to build, and the cost of a later step
    python benchmarks/spec_decode.py suffix-build --prompt-lengths 1024,4096,16384

e2e: each method runs the same greedy workload (chat prompts rendered with Harmony when the checkpoint
has a tokenizer.json: a code rewrite, a quote-heavy summary and an open story; repetitive token
prompts otherwise) at each batch size, after a warm-up; tok/s counts generated tokens over wall time,
speedup is against the run without speculation, and the spec stats come from EngineStats.spec_stats.
graph% is the share of the timed run's target-model steps that replayed a CUDA graph (the eager ones,
by reason, are in the JSON) and maxStep the slowest engine step: a one-off stall (a Triton compile)
shows there, not in graph%. --tree adds draft-tree and eagle3-tree rows: the same proposers with
tree drafts (top-k children per depth, verified with a tree attention mask; such steps run eagerly).
auto times its step-cost table when its engine starts (with CUDA graphs; the line "auto: step costs
timed at start-up in ... s" shows it, gossamer/spec/calibrate.py) unless --auto-cost-table gives one,
and charges the proposers' measured host time; each auto row prints the plain step and proposing
times it ended with, and its measured guard's state per batch bucket (on by default for auto;
gossamer/spec/guard.py: per mode the tokens/s of its last window and what a request waited per
token there, and whether it speculates). --methods ...,auto-noguard adds auto
without the guard ("measured_guard": false: the cost model alone, the guard's own effect);
...,auto-fixed adds auto as it was before: the built-in table, host time free, no guard.
Every method, "none" included, runs with overlapped scheduling as `gossamer serve` does by default
(--no-async-scheduling: synchronous steps), so that speedups are against the default serving
engine; with a speculator, plain decode steps overlap while it is idle at the batch (the column
overlap counts the timed run's overlapped steps; Speculator.idle_for). --runs N times N runs on
fresh prompts (tok/s: their median); --interleave builds every method's engine first and times
run 1 of each method, then run 2 of each, ... (on a shared machine the host's speed drifts between
rows: none at batch 1 measured 2,594 and 3,286 tok/s in two calls of the ninth session; all the
engines' KV caches are allocated at once); --profile prints where each row's host time went
(cProfile, which slows the runs: time without it).

verify-cost: a step of B sequences that each feed 1 + k tokens at context C, timed eagerly and by
replaying the CUDA graph captured for that uniform (B, 1 + k) step; k = 0 is the plain decode a
verification step replaces. The floor is the bytes the step must read (weights, the experts that
B * (k + 1) tokens touch, the KV of B sequences) over the copy bandwidth: it shows why k extra tokens
cost little while decode is memory bound, and how the MoE reads more experts as k grows.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import platform
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import step_bytes  # noqa: E402
from timing import copy_bandwidth  # noqa: E402

from gossamer.engine.core import EngineConfig, EngineCore  # noqa: E402
from gossamer.model.loader import load_model  # noqa: E402
from gossamer.runner.model_runner import GRAPH, ModelRunner  # noqa: E402
from gossamer.runner.sampler import SamplingRow  # noqa: E402
from gossamer.sampling_params import SamplingParams  # noqa: E402
from gossamer.spec.calibrate import format_cost_table, time_step, verify_seqs  # noqa: E402
from gossamer.spec.config import MODEL_METHODS, SpecConfig  # noqa: E402
from gossamer.spec.cost import DEFAULT_COST_TABLE  # noqa: E402
from gossamer.spec.proposer import SpecRequest  # noqa: E402
from gossamer.spec.suffix import SuffixProposer  # noqa: E402
from gossamer.spec.suffix_trie import SuffixTrie  # noqa: E402

BLOCK = 16
DEFAULT_TREE = "3,1,1,1"  # top 3 at the first depth, chains below: 12 nodes, depth 4
TREE_SUFFIX = "-tree"
AUTO_FIXED = "auto-fixed"
AUTO_NOGUARD = "auto-noguard"
COMPARISONS = (AUTO_FIXED, AUTO_NOGUARD)  # rows only when asked for


# ---- e2e ----------------------------------------------------------------------------------------


@dataclass
class E2eRow:
    method: str
    batch: int
    generated_tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float
    mean_accepted_length: float
    acceptance_rate: float
    graph_fraction: float  # of the target-model steps, those that replayed a CUDA graph
    slowest_step_ms: float
    runner_steps: dict[str, int]  # the timed run's steps by mode (EngineStats.runner_steps)
    tree_drafts: int = 0  # drafts that were trees (--tree rows)
    # cost-aware rows: the times the cost model converts host time with, at the row's end
    # (cost_plain_step_us, <method>_propose_us_per_request), and the step costs it timed
    cost_times: dict[str, float] = field(default_factory=dict)
    measured_cost_table: str | None = None
    # the measured guard at the row's end (guard_b{bucket}_*), and the steps it kept plain
    guard: dict[str, float] = field(default_factory=dict)
    overlapped_steps: int = 0  # launched before the previous step's tokens reached the host
    runs_tokens_per_s: list[float] = field(default_factory=list)  # each timed run (--runs)

    def line(self) -> str:
        return (
            f"{self.method:12s} {self.batch:5d} {self.generated_tokens:7d} {self.seconds:8.2f} "
            f"{self.tokens_per_s:9.1f} {self.speedup:7.2f}x {self.mean_accepted_length:6.2f} "
            f"{self.acceptance_rate:6.2f} {100 * self.graph_fraction:6.1f} "
            f"{self.slowest_step_ms:8.1f} {self.overlapped_steps:7d}"
        ) + self._cost_line()

    def _cost_line(self) -> str:
        line = ""
        if self.cost_times:
            times = ", ".join(
                f"{name} {value:.1f}" for name, value in sorted(self.cost_times.items())
            )
            line += f"\n{'':12s} cost model at the end: {times}"
        if self.guard:
            state = ", ".join(f"{name} {value:g}" for name, value in sorted(self.guard.items()))
            line += f"\n{'':12s} measured guard: {state}"
        return line


def source_text() -> str:
    """A real Python module to rewrite (repetition-friendly: the answer copies most of it)."""
    return (Path(__file__).resolve().parent.parent / "gossamer" / "spec" / "ngram.py").read_text()


CHAT_PROMPTS = (
    "Here is a Python module:\n```python\n{code}\n```\nRewrite the whole module with more "
    "detailed comments. Output the complete module.",
    "Summarise this module for a new contributor, quoting the key lines verbatim:\n{code}",
    "Write a short story about a lighthouse keeper who learns to program.",
)


def workload(loaded, batch: int, seed: int) -> list[list[int]]:
    """`batch` prompts; another seed gives other prompts, which share at most the chat template's
    header with these, so that a warm-up leaves no prefix-cache hits that change the timed run's
    shapes (a 5-token prefill tail once cost the first row a Triton compile, ~1 s)."""
    tokenizer_file = loaded.checkpoint / "tokenizer.json" if loaded.checkpoint else None
    if tokenizer_file is not None and tokenizer_file.is_file():
        from gossamer.harmony.render import render_chat
        from gossamer.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_file(loaded.checkpoint)
        code = source_text()
        prompts = [
            render_chat(
                tokenizer,
                [{"role": "user", "content": _chat_prompt(i, seed, code)}],
                reasoning_effort="low",
            )
            for i in range(batch)
        ]
        return prompts
    gen = torch.Generator().manual_seed(seed)
    vocab = loaded.config.vocab_size
    prompts = []
    for _ in range(batch):
        phrase = torch.randint(0, vocab, (12,), generator=gen).tolist()
        prompts.append(phrase * 8 + torch.randint(0, vocab, (16,), generator=gen).tolist())
    return prompts


def _chat_prompt(index: int, seed: int, code: str) -> str:
    # NOTE: the seed tag comes first so that prompts of two seeds part right after the header.
    return f"(task {seed}) " + CHAT_PROMPTS[index % 3].format(code=code)


def method_configs(args: argparse.Namespace) -> dict[str, SpecConfig | None]:
    k = args.num_speculative_tokens
    methods: dict[str, SpecConfig | None] = {
        "none": None,
        "ngram": SpecConfig(method="ngram", num_speculative_tokens=k),
        "suffix": SpecConfig(method="suffix", num_speculative_tokens=k),
    }
    if args.draft:
        methods["draft"] = SpecConfig(
            method="draft",
            model=args.draft,
            num_speculative_tokens=k,
            draft_load_format=args.draft_load_format,
        )
    if args.eagle3:
        methods["eagle3"] = SpecConfig(method="eagle3", model=args.eagle3, num_speculative_tokens=k)
    auto_model = args.draft or args.eagle3  # auto adds one model-based proposer
    methods["auto"] = SpecConfig(
        method="auto",
        model=auto_model,
        num_speculative_tokens=k,
        draft_load_format=args.draft_load_format,
        cost_table=args.auto_cost_table,
    )
    # auto as it was before it timed its costs: the fixed table, drafts free on the host
    methods[AUTO_FIXED] = replace(
        methods["auto"],
        cost_table=args.auto_cost_table or DEFAULT_COST_TABLE,
        charge_proposer_time=False,
        measured_guard=False,
    )
    methods[AUTO_NOGUARD] = replace(methods["auto"], measured_guard=False)
    methods |= tree_configs(args, methods)
    default = [name for name in methods if name not in COMPARISONS]  # comparisons, when asked
    wanted = args.methods.split(",") if args.methods else default
    if args.tree:  # each chosen model method brings its tree variant along
        wanted = [w for name in wanted for w in (name, name + TREE_SUFFIX) if w in methods]
    return {name: methods[name] for name in dict.fromkeys(wanted) if name in methods}


def tree_configs(
    args: argparse.Namespace, methods: dict[str, SpecConfig | None]
) -> dict[str, SpecConfig]:
    """With --tree: "draft-tree" and "eagle3-tree", the chain configs with tree drafts (the
    engine verifies them with a tree attention mask, eagerly). A tree as deep as k or deeper
    raises k to its depth."""
    if not args.tree:
        return {}
    tree = {"branching": args.tree}
    depth = len(args.tree)
    variants = {
        name + TREE_SUFFIX: replace(
            config,
            tree=tree,
            num_speculative_tokens=max(config.num_speculative_tokens, depth),
        )
        for name, config in methods.items()
        if name in MODEL_METHODS and config is not None
    }
    if not variants:
        print("--tree: no tree variants without --draft or --eagle3", file=sys.stderr)
    return variants


def run_workload(
    engine: EngineCore, prompts: list[list[int]], max_tokens: int
) -> tuple[int, float, float]:
    """Returns (generated tokens, seconds, seconds of the slowest step)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt, params)
    _sync()
    start = previous = time.perf_counter()
    generated, slowest = 0, 0.0
    while engine.has_unfinished_requests():
        # NOTE: a step ends with the host reading the sampled tokens, so its wall time is its cost
        generated += sum(len(out.new_token_ids) for out in engine.step())
        now = time.perf_counter()
        slowest, previous = max(slowest, now - previous), now
    _sync()
    return generated, time.perf_counter() - start, slowest


def bench_e2e(args: argparse.Namespace) -> list[E2eRow]:
    loaded = load_model(
        args.model,
        load_format=args.load_format,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
    )
    methods = method_configs(args)
    if args.interleave:
        return _interleaved_e2e(args, loaded, methods)
    rows: list[E2eRow] = []
    baseline: dict[int, float] = {}
    for name, spec in methods.items():
        engine, measured = _e2e_engine(args, loaded, name, spec)
        for batch in args.batch_sizes:
            _warm_up(engine, loaded, batch, args.max_tokens)
            measurement = E2eMeasurement(engine, measured, args.profile)
            for r in range(args.runs):
                measurement.run(loaded, batch, r, args.max_tokens)
            rows.append(measurement.report(name, batch, baseline))
        del engine
        _free()
    return rows


def _interleaved_e2e(args, loaded, methods: dict[str, SpecConfig | None]) -> list[E2eRow]:
    """Every method's engine built first, then their timed runs in turn (run 1 of each method,
    run 2 of each, ...): a drift of the machine (the host's clocks, other tenants) between runs
    then hits every method alike instead of whichever ran during it."""
    engines = {name: _e2e_engine(args, loaded, name, spec) for name, spec in methods.items()}
    rows: list[E2eRow] = []
    baseline: dict[int, float] = {}
    for batch in args.batch_sizes:
        for engine, _ in engines.values():
            _warm_up(engine, loaded, batch, args.max_tokens)
        measurements = {
            name: E2eMeasurement(*built, args.profile) for name, built in engines.items()
        }
        for r in range(args.runs):
            for measurement in measurements.values():
                measurement.run(loaded, batch, r, args.max_tokens)
        for name, measurement in measurements.items():  # none first: method_configs' order
            rows.append(measurement.report(name, batch, baseline))
    return rows


def _e2e_engine(args, loaded, name: str, spec: SpecConfig | None) -> tuple[EngineCore, str | None]:
    config = EngineConfig(
        max_num_seqs=max(args.batch_sizes),
        kv_cache_memory=int(args.kv_cache_gib * (1 << 30)),
        speculative_config=spec,
        cuda_graphs=not args.no_cuda_graphs,
        async_scheduling=args.async_scheduling,
    )
    engine = EngineCore(loaded.model, None, config)
    measured = _measured_cost_table(engine)
    if measured is not None:
        seconds = engine.speculator.calibration_seconds
        print(f"{name}: step costs timed at start-up in {seconds:.2f} s (ms): {measured}")
    return engine, measured


def _warm_up(engine: EngineCore, loaded, batch: int, max_tokens: int) -> None:
    """The same batch and length on other prompts (no prefix-cache hits). Triton compiles kernels
    for new shapes on first use, and some depend on the context length, so a short warm-up once
    left the first method's row 7x too slow."""
    run_workload(engine, workload(loaded, batch, seed=1000 + batch), max_tokens)


class E2eMeasurement:
    """One method's timed runs at one batch size: its engine's counters before them, each run."""

    def __init__(self, engine: EngineCore, measured: str | None, profile: bool = False) -> None:
        self.engine, self.measured = engine, measured
        self.profiler = cProfile.Profile() if profile else None
        self.spec_before = dict(engine.stats.spec_stats)
        self.steps_before = dict(engine.stats.runner_steps)
        self.overlapped_before = engine.num_overlapped_steps
        self.runs: list[tuple[int, float, float]] = []

    def run(self, loaded, batch: int, index: int, max_tokens: int) -> None:
        # fresh prompts each time: no prefix-cache hits between the runs
        prompts = workload(loaded, batch, seed=batch + 7919 * index)
        if self.profiler is not None:
            self.profiler.enable()
        self.runs.append(run_workload(self.engine, prompts, max_tokens))
        if self.profiler is not None:
            self.profiler.disable()

    def report(self, name: str, batch: int, baseline: dict[int, float]) -> E2eRow:
        """`row`, printed (with the host profile under --profile)."""
        row = self.row(name, batch, baseline)
        print(row.line(), flush=True)
        if self.profiler is not None:
            self.print_profile(name, batch)
        return row

    def print_profile(self, name: str, batch: int, top: int = 25) -> None:
        """The host's time in the runs by function (--profile; the profiler slows the host, so
        such runs are for where the time goes, not for their speed)."""
        steps = sum(tokens for tokens, _, _ in self.runs) / batch
        print(f"--- {name} at batch {batch}: host profile over ~{steps:.0f} steps (tottime)")
        pstats.Stats(self.profiler).sort_stats("tottime").print_stats(top)
        print(f"--- {name} at batch {batch}: the engine's and the speculator's parts (cumulative)")
        pstats.Stats(self.profiler).sort_stats("cumulative").print_stats("spec/|engine/core", top)

    def row(self, name: str, batch: int, baseline: dict[int, float]) -> E2eRow:
        """The row of the runs (tok/s: their median; counters: over all of them); a "none" row
        sets the batch size's baseline."""
        engine = self.engine
        speeds = [tokens / seconds for tokens, seconds, _ in self.runs]
        stats = _delta(self.spec_before, engine.stats.spec_stats, "num_")
        steps = _delta(self.steps_before, engine.stats.runner_steps)
        speed = statistics.median(speeds)
        if name == "none":
            baseline[batch] = speed
        drafts = stats.get("num_drafts", 0)
        return E2eRow(
            name,
            batch,
            sum(run[0] for run in self.runs),
            sum(run[1] for run in self.runs),
            speed,
            speed / baseline.get(batch, speed),
            1 + stats.get("num_accepted_tokens", 0) / drafts if drafts else 1.0,
            stats.get("num_accepted_tokens", 0) / max(stats.get("num_draft_tokens", 0), 1),
            steps.get(GRAPH, 0) / max(sum(steps.values()), 1),
            1e3 * max(run[2] for run in self.runs),
            steps,
            stats.get("num_tree_drafts", 0),
            _cost_times(engine.stats.spec_stats),
            self.measured,
            _guard_state(engine.stats.spec_stats, stats),
            engine.num_overlapped_steps - self.overlapped_before,
            speeds,
        )


def _measured_cost_table(engine: EngineCore) -> str | None:
    table = getattr(engine.speculator, "measured_cost_table", None)
    return format_cost_table(table) if table else None


def _cost_times(spec_stats: dict[str, float]) -> dict[str, float]:
    return {
        name: round(value, 1)
        for name, value in spec_stats.items()
        if name.endswith("_us") or name.endswith("_us_per_request")
    }


def _guard_state(spec_stats: dict[str, float], counted: dict[str, float]) -> dict[str, float]:
    """The guard's last windows and choices per bucket (rounded; waits in ms to the us), and the
    timed run's steps it kept plain."""
    state = {
        name: round(value, 3 if name.endswith("_ms_per_token") else 1)
        for name, value in spec_stats.items()
        if name.startswith("guard_")
    }
    if state:
        state["num_guard_off_steps"] = counted.get("num_guard_off_steps", 0)
    return state


def _delta(before: dict, after: dict, prefix: str = "") -> dict:
    """The counters (names starting with `prefix`) that changed from `before` to `after`."""
    changes = {key: value - before.get(key, 0) for key, value in after.items()}
    return {key: change for key, change in changes.items() if key.startswith(prefix) and change}


# ---- verification cost ---------------------------------------------------------------------------


@dataclass
class VerifyRow:
    batch: int
    context: int
    k: int
    mode: str  # eager | graph
    ms_per_step: float
    ratio_to_decode: float  # over the k = 0 step in the same mode
    floor_ms: float
    max_tokens_per_s: float  # if every draft is accepted

    def line(self) -> str:
        return (
            f"{self.batch:5d} {self.context:6d} {self.k:3d} {self.mode:5s} {self.ms_per_step:9.3f} "
            f"{self.ratio_to_decode:6.2f}x {self.floor_ms:8.3f} {self.max_tokens_per_s:10.1f}"
        )


def verify_bytes(cfg, batch: int, k: int, context: int) -> float:
    """Bytes a verification step reads: weights and experts for batch * (k + 1) tokens, the KV of
    `batch` sequences (step_bytes counts KV per token, so it is taken from the batch alone)."""
    weights = step_bytes(cfg, batch * (k + 1), 0)
    kv = step_bytes(cfg, batch, context) - step_bytes(cfg, batch, 0)
    return weights + kv


def bench_verify_cost(args: argparse.Namespace) -> list[VerifyRow]:
    max_k = max(args.ks)
    max_len = args.context + max_k + 16
    loaded = load_model(
        args.model,
        load_format=args.load_format,
        device=args.device,
        dtype=args.dtype,
        max_model_len=max_len,
    )
    model, cfg = loaded.model, loaded.config
    biggest = max(args.batch_sizes)
    blocks_per_seq = math.ceil(max_len / BLOCK)
    groups = model.num_cache_groups
    runner = ModelRunner(
        model,
        num_blocks=1 + groups * biggest * blocks_per_seq,
        block_size=BLOCK,
        max_num_seqs=biggest,
        max_num_batched_tokens=biggest * (max_k + 1),
        cuda_graphs=not args.no_cuda_graphs,
        graph_sizes=tuple(args.batch_sizes),
        graph_query_lens=tuple(1 + k for k in args.ks),
    )
    runner.kv_cache.normal_(0, 0.5)  # random KV: reading it costs what a real context costs
    graphs = runner.graphs
    bandwidth = copy_bandwidth() if args.device == "cuda" else float("nan")
    rows: list[VerifyRow] = []
    for batch in args.batch_sizes:
        decode_seconds: dict[str, float] = {}  # k = 0, per mode: what verification replaces
        for k in args.ks:
            seqs = verify_seqs(batch, k, args.context, blocks_per_seq, groups)
            captured = any(key == (batch, k + 1) for key in graphs)
            for mode in ["eager", "graph"] if captured else ["eager"]:
                runner.graphs = graphs if mode == "graph" else {}
                seconds = time_step(runner, seqs, args.steps, warmups=3)  # the median step
                if k == 0:
                    decode_seconds[mode] = seconds
                base = decode_seconds.get(mode)
                floor = verify_bytes(cfg, batch, k, args.context) / bandwidth
                row = VerifyRow(
                    batch,
                    args.context,
                    k,
                    mode,
                    1e3 * seconds,
                    seconds / base if base else float("nan"),
                    1e3 * floor,
                    batch * (k + 1) / seconds,
                )
                rows.append(row)
                print(row.line(), flush=True)
        runner.graphs = graphs
    return rows


def cost_table(rows: list[VerifyRow]) -> dict[str, dict[str, float]]:
    """{batch: {k: ms per step}} for SpecConfig.cost_table: graph replay where it was captured
    (what a uniform verification step costs in the engine), else eager."""
    table: dict[str, dict[str, float]] = {}
    for mode in ("eager", "graph"):  # graph rows overwrite eager ones
        for row in rows:
            if row.mode == mode:
                table.setdefault(str(row.batch), {})[str(row.k)] = round(row.ms_per_step, 4)
    return table


# ---- suffix proposer: the per-request index --------------------------------------------------------


@dataclass
class SuffixBuildRow:
    prompt_tokens: int
    # a trie of every substring, token by token: the index before (it then was one object per
    # node, about 4x slower than this flat SuffixTrie: 160 ms for 4k tokens on a 2-core CPU)
    trie_build_ms: float
    first_proposal_ms: float  # the first proposal for a new request (it builds the index)
    step_us: float  # a later proposal, after the request gained 3 tokens

    def line(self) -> str:
        return (
            f"{self.prompt_tokens:7d} {self.trie_build_ms:10.2f} {self.first_proposal_ms:10.2f} "
            f"{self.step_us:8.1f}"
        )


def phrase_tokens(length: int, seed: int, vocab: int = 50_000) -> list[int]:
    """Text-like tokens: 400 phrases of 3-12 tokens from a 50k vocabulary, in random order (so
    that a suffix matches often, as in code or templated text)."""
    gen = torch.Generator().manual_seed(seed)
    phrases = [
        torch.randint(0, vocab, (int(torch.randint(3, 13, (1,), generator=gen)),), generator=gen)
        for _ in range(400)
    ]
    picks = torch.randint(0, len(phrases), (length,), generator=gen).tolist()
    tokens: list[int] = []
    for pick in picks:
        if len(tokens) >= length:
            break
        tokens += phrases[pick].tolist()
    return tokens[:length]


def _best_seconds(work, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def bench_suffix_build(args: argparse.Namespace) -> list[SuffixBuildRow]:
    """CPU only: what a suffix proposer's first proposal for a request costs against the
    prompt's length, next to the trie it built before, and what each later step costs."""
    depth = SpecConfig().suffix_decoding_max_tree_depth
    row = SamplingRow(SamplingParams(temperature=0), [], [], None)
    rows = []
    for length in args.prompt_lengths:
        # the prompt and what the request generates later, of one set of phrases
        text = phrase_tokens(length + 3 * args.suffix_steps, seed=length)
        prompt, more = text[:length], text[length:]

        def first_proposal(tokens=prompt) -> SuffixProposer:
            proposer = SuffixProposer(args.num_speculative_tokens, max_depth=depth)
            proposer.propose([SpecRequest("r", tokens, len(tokens), 8, row)])
            return proposer

        trie = _best_seconds(lambda tokens=prompt: SuffixTrie(depth).add(tokens), args.repeats)
        first = _best_seconds(first_proposal, args.repeats)
        proposer, tokens = first_proposal(list(prompt)), list(prompt)
        start = time.perf_counter()
        for step in range(args.suffix_steps):
            tokens += more[3 * step : 3 * step + 3]
            proposer.propose([SpecRequest("r", tokens, length, 8, row)])
        step_seconds = (time.perf_counter() - start) / args.suffix_steps
        result = SuffixBuildRow(length, 1e3 * trie, 1e3 * first, 1e6 * step_seconds)
        rows.append(result)
        print(result.line(), flush=True)
    return rows


# ---- main ----------------------------------------------------------------------------------------


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.mode == "e2e":
        print(f"async scheduling: {'on' if args.async_scheduling else 'off'}")
        print(
            f"{'method':12s} batch  tokens  seconds     tok/s speedup  accLen accRate graph% maxStep"
            " overlap"
        )
        rows = [asdict(row) for row in bench_e2e(args)]
    elif args.mode == "verify-cost":
        print("batch    ctx   k mode   ms/step  vs k=0 floor_ms  max tok/s")
        verify_rows = bench_verify_cost(args)
        rows = [asdict(row) for row in verify_rows]
        if args.cost_table:
            _write_cost_table(args, verify_rows)
    else:
        print(f"{'prompt':>7s} {'trie ms':>10s} {'first ms':>10s} {'step us':>8s}")
        rows = [asdict(row) for row in bench_suffix_build(args)]
    if args.json:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "args": vars(args),
            "rows": rows,
        }
        if args.mode == "e2e":
            result["async_scheduling"] = args.async_scheduling
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("mode", choices=("e2e", "verify-cost", "suffix-build"))
    parser.add_argument("--model", help="checkpoint folder or preset name (e2e, verify-cost)")
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--json", default=None)
    e2e = parser.add_argument_group("e2e")
    e2e.add_argument("--methods", default=None, help="subset, e.g. none,ngram,draft")
    e2e.add_argument("--draft", default=None, help="draft model checkpoint (or preset + dummy)")
    e2e.add_argument("--draft-load-format", choices=("auto", "dummy"), default="auto")
    e2e.add_argument("--eagle3", default=None, help="EAGLE-3 head checkpoint")
    e2e.add_argument("--num-speculative-tokens", type=int, default=4)
    e2e.add_argument("--max-tokens", type=int, default=256)
    e2e.add_argument(
        "--runs",
        type=int,
        default=1,
        help="timed runs per method and batch size (fresh prompts each); tok/s is their median",
    )
    e2e.add_argument(
        "--profile",
        action="store_true",
        help="profile the host in the timed runs (cProfile; slows them) and print where each "
        "row's time went",
    )
    e2e.add_argument(
        "--interleave",
        action="store_true",
        help="build every method's engine first, then time run 1 of each, run 2 of each, ... "
        "(the host's speed drifts between runs on a shared machine)",
    )
    e2e.add_argument("--kv-cache-gib", type=float, default=8.0)
    e2e.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlapped scheduling for every method, none included (default on, as `gossamer "
        "serve`): plain decode steps launch before the previous step's tokens reach the host",
    )
    e2e.add_argument(
        "--auto-cost-table",
        default=None,
        help="the step-cost table auto decides with (a file verify-cost --cost-table wrote, for "
        "this model and GPU); default: timed at engine start-up (CUDA graphs), else the built-in "
        "gpt-oss-120b H200 table",
    )
    e2e.add_argument(
        "--tree",
        nargs="?",
        const=DEFAULT_TREE,
        default=None,
        metavar="BRANCHING",
        help="also run draft and eagle3 with tree drafts (rows draft-tree, eagle3-tree): the "
        f"top-k children per depth, default {DEFAULT_TREE}",
    )
    cost = parser.add_argument_group("verify-cost")
    cost.add_argument("--ks", default="0,1,2,3,4,5,6,7")
    cost.add_argument("--context", type=int, default=1024)
    cost.add_argument("--steps", type=int, default=20)
    cost.add_argument("--cost-table", default=None, help="write the step-cost table (JSON) here")
    suffix = parser.add_argument_group("suffix-build (CPU)")
    suffix.add_argument("--prompt-lengths", default="1024,4096,16384")
    suffix.add_argument("--repeats", type=int, default=3)
    suffix.add_argument("--suffix-steps", type=int, default=200)
    args = parser.parse_args(argv)
    if args.mode != "suffix-build" and args.model is None:
        parser.error(f"{args.mode} needs --model")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.ks = [int(k) for k in args.ks.split(",")]
    args.prompt_lengths = [int(n) for n in args.prompt_lengths.split(",")]
    if args.tree is not None:
        args.tree = [int(b) for b in args.tree.split(",")]
    return args


def _write_cost_table(args: argparse.Namespace, rows: list[VerifyRow]) -> None:
    result = {
        "model": args.model,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
        "context": args.context,
        "cost_table": cost_table(rows),
    }
    Path(args.cost_table).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
