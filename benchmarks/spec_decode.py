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

e2e: each method runs the same greedy workload (chat prompts rendered with Harmony when the checkpoint
has a tokenizer.json: a code rewrite, a quote-heavy summary and an open story; repetitive token
prompts otherwise) at each batch size, after a warm-up; tok/s counts generated tokens over wall time,
speedup is against the run without speculation, and the spec stats come from EngineStats.spec_stats.
graph% is the share of the timed run's target-model steps that replayed a CUDA graph (the eager ones,
by reason, are in the JSON) and maxStep the slowest engine step: a one-off stall (a Triton compile)
shows there, not in graph%.

verify-cost: a step of B sequences that each feed 1 + k tokens at context C, timed eagerly and by
replaying the CUDA graph captured for that uniform (B, 1 + k) step; k = 0 is the plain decode a
verification step replaces. The floor is the bytes the step must read (weights, the experts that
B * (k + 1) tokens touch, the KV of B sequences) over the copy bandwidth: it shows why k extra tokens
cost little while decode is memory bound, and how the MoE reads more experts as k grows.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import step_bytes  # noqa: E402
from timing import copy_bandwidth  # noqa: E402

from gossamer.engine.core import EngineConfig, EngineCore  # noqa: E402
from gossamer.model.loader import load_model  # noqa: E402
from gossamer.runner.model_runner import GRAPH, ModelRunner, SeqInput  # noqa: E402
from gossamer.sampling_params import SamplingParams  # noqa: E402
from gossamer.spec.config import SpecConfig  # noqa: E402

BLOCK = 16


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

    def line(self) -> str:
        return (
            f"{self.method:8s} {self.batch:5d} {self.generated_tokens:7d} {self.seconds:8.2f} "
            f"{self.tokens_per_s:9.1f} {self.speedup:7.2f}x {self.mean_accepted_length:6.2f} "
            f"{self.acceptance_rate:6.2f} {100 * self.graph_fraction:6.1f} "
            f"{self.slowest_step_ms:8.1f}"
        )


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
    )
    wanted = args.methods.split(",") if args.methods else list(methods)
    return {name: methods[name] for name in wanted if name in methods}


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
    rows: list[E2eRow] = []
    baseline: dict[int, float] = {}
    for name, spec in method_configs(args).items():
        config = EngineConfig(
            max_num_seqs=max(args.batch_sizes),
            kv_cache_memory=int(args.kv_cache_gib * (1 << 30)),
            speculative_config=spec,
            cuda_graphs=not args.no_cuda_graphs,
        )
        engine = EngineCore(loaded.model, None, config)
        for batch in args.batch_sizes:
            # Warm-up: the same batch and length on other prompts (no prefix-cache hits). Triton
            # compiles kernels for new shapes on first use, and some depend on the context
            # length, so a short warm-up once left the first method's row 7x too slow.
            run_workload(engine, workload(loaded, batch, seed=1000 + batch), args.max_tokens)
            before = dict(engine.stats.spec_stats)
            steps_before = dict(engine.stats.runner_steps)
            generated, seconds, slowest = run_workload(
                engine, workload(loaded, batch, seed=batch), args.max_tokens
            )
            stats = _delta(before, engine.stats.spec_stats, "num_")
            steps = _delta(steps_before, engine.stats.runner_steps)
            speed = generated / seconds
            if name == "none":
                baseline[batch] = speed
            drafts = stats.get("num_drafts", 0)
            row = E2eRow(
                name,
                batch,
                generated,
                seconds,
                speed,
                speed / baseline.get(batch, speed),
                1 + stats.get("num_accepted_tokens", 0) / drafts if drafts else 1.0,
                stats.get("num_accepted_tokens", 0) / max(stats.get("num_draft_tokens", 0), 1),
                steps.get(GRAPH, 0) / max(sum(steps.values()), 1),
                1e3 * slowest,
                steps,
            )
            rows.append(row)
            print(row.line(), flush=True)
        del engine
        _free()
    return rows


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


def verify_seqs(batch: int, k: int, context: int, blocks_per_seq: int, groups: int):
    seqs = []
    for b in range(batch):
        base = 1 + groups * b * blocks_per_seq
        tables = tuple(
            list(range(base + g * blocks_per_seq, base + (g + 1) * blocks_per_seq))
            for g in range(groups)
        )
        seqs.append(SeqInput([1] * (k + 1), context, tables, num_logits=k + 1))
    return seqs


def time_steps(runner: ModelRunner, seqs: list[SeqInput], steps: int) -> float:
    for _ in range(3):
        runner.run(seqs).argmax(-1).tolist()
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        runner.run(seqs).argmax(-1).tolist()  # the host reads the tokens, as the engine does
    _sync()
    return (time.perf_counter() - start) / steps


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
                seconds = time_steps(runner, seqs, args.steps)
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


# ---- main ----------------------------------------------------------------------------------------


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("mode", choices=("e2e", "verify-cost"))
    parser.add_argument("--model", required=True, help="checkpoint folder or preset name")
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
    e2e.add_argument("--kv-cache-gib", type=float, default=8.0)
    cost = parser.add_argument_group("verify-cost")
    cost.add_argument("--ks", default="0,1,2,3,4,5,6,7")
    cost.add_argument("--context", type=int, default=1024)
    cost.add_argument("--steps", type=int, default=20)
    cost.add_argument("--cost-table", default=None, help="write the step-cost table (JSON) here")
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.ks = [int(k) for k in args.ks.split(",")]
    if args.mode == "e2e":
        print("method   batch  tokens  seconds     tok/s speedup  accLen accRate graph% maxStep")
        rows = [asdict(row) for row in bench_e2e(args)]
    else:
        print("batch    ctx   k mode   ms/step  vs k=0 floor_ms  max tok/s")
        verify_rows = bench_verify_cost(args)
        rows = [asdict(row) for row in verify_rows]
        if args.cost_table:
            _write_cost_table(args, verify_rows)
    if args.json:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "args": vars(args),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


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
