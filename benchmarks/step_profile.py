"""Where one decode step's time goes, kernel by kernel (issue #8).

    python benchmarks/step_profile.py                         # 120b and 20b, batch 1 and 64
    python benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --json profile.json
    python benchmarks/step_profile.py --smoke                 # CPU: built-in mini model, CPU ops
    python benchmarks/step_profile.py --models gpt-oss-120b --prefill 8x1024   # one prefill step

The model is built as decode_speed.py builds it: dummy weights, a ModelRunner with CUDA graphs for
the batch sizes asked, random KV, every sequence at --context tokens. Per batch size:

1. a few eager decode steps (the same inputs, the graphs set aside) run under torch.profiler; the
   GPU kernels are grouped by name: calls per step, calls per layer (calls / num_hidden_layers),
   microseconds per call, per step and per layer (per step / num_hidden_layers), and share of the
   graph step. Memcpy and memset are counted apart from the kernel launches;
2. the CUDA-graph step is timed as decode_speed.timed_decode times it (fill inputs, replay, greedy
   pick, tokens to the host): that time minus the eager kernels' sum is "gaps + host", the idle
   GPU time between kernels inside the graph plus the host's share of the loop;
3. the graph steps are profiled too. Where the profiler sees the kernels inside a replay (CUPTI
   reports graph kernels on recent drivers), that gives the gaps without the eager stand-in.

The eager kernels are the graph's kernels with two differences: eager attention is sized from the
true context rather than the graph's max_model_len bound, and eager steps gather the logits rows
first.

--prefill PxL (comma-separated) profiles prefill steps instead of (or, with --batch-sizes, beside)
decode steps: P new prompts of L random tokens each in one step, as the engine's chunked prefill
packs them (8x1024 is one step of C=256's 1k prompts at the default 8,192-token budget). Prefill
steps run eagerly in the engine too, so the step is timed eagerly; the table adds the step's
matmul FLOPs (projections, experts, attention scores; the unembedding of the last tokens) and
the rate they ran at.

With --smoke on a CPU there is no graph: the table lists CPU ops by self time, and the step time
is the eager loop's.

On a GPU each model is profiled in a process of its own (CUPTI may collect nothing after a
profiler session that ran before a graph capture, and the next model's graphs are captured then).

Expected device time (H200, predicted, not yet measured): per model about 20 to 40 s of loading,
graph capture and the first eager steps compile the Triton kernels (up to a minute without a warm
cache), then a few seconds per batch size: 2 to 3 min for both models at batch 1 and 64.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from unittest import mock

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import BLOCK, fill_random, make_seqs, timed_decode  # noqa: E402
from throughput import fill_defaults, load_dummy, run_info  # noqa: E402

from gossamer.engine.core import KV_CACHE_DTYPES, kv_cache_dtype  # noqa: E402
from gossamer.runner.model_runner import ModelRunner  # noqa: E402

COPY_PREFIXES = ("Memcpy", "Memset")  # how CUPTI names copies and fills
SMOKE = {"batch_sizes": "1,2", "context": 32, "timed_steps": 2, "profile_steps": 1}


@dataclass
class KernelRow:
    name: str
    calls_per_step: float
    calls_per_layer: float
    us_per_call: float
    us_per_step: float
    us_per_layer: float
    share_of_step: float  # of the graph step (the eager step on a CPU)


@dataclass
class Profile:
    """Device events of `steps` identical steps: kernels (CPU ops on a CPU) and copies."""

    kernels: list[tuple[str, float]]  # (name, microseconds)
    copies: list[tuple[str, float]]
    steps: int

    def per_step(self, events: list[tuple[str, float]]) -> tuple[float, float]:
        """(events per step, microseconds per step)."""
        return len(events) / self.steps, sum(us for _, us in events) / self.steps


def profile_steps(step: Callable[[], object], steps: int, on_gpu: bool) -> Profile:
    """Run `step` `steps` times under torch.profiler and keep the device's events."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    if on_gpu:
        events = [
            (e.name, e.time_range.elapsed_us())
            for e in prof.events()
            # a user annotation projected onto the GPU spans kernels: not one of them
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        ]
    else:  # self time, so that an op and the ops it calls are not counted twice
        events = [(e.name, e.self_cpu_time_total) for e in prof.events()]
    kernels = [(name, us) for name, us in events if not name.startswith(COPY_PREFIXES)]
    copies = [(name, us) for name, us in events if name.startswith(COPY_PREFIXES)]
    return Profile(kernels, copies, steps)


def kernel_table(prof: Profile, num_layers: int, step_us: float) -> list[KernelRow]:
    """Kernels grouped by name, the most time per step first."""
    times: dict[str, list[float]] = defaultdict(list)
    for name, us in prof.kernels + prof.copies:
        times[name].append(us)
    rows = []
    for name, calls in times.items():
        per_step = sum(calls) / prof.steps
        rows.append(
            KernelRow(
                name,
                len(calls) / prof.steps,
                len(calls) / prof.steps / num_layers,
                sum(calls) / len(calls),
                per_step,
                per_step / num_layers,
                per_step / step_us,
            )
        )
    return sorted(rows, key=lambda row: -row.us_per_step)


@contextmanager
def eager(runner: ModelRunner) -> Iterator[None]:
    """Set the captured graphs aside, so that every step launches its kernels one by one."""
    graphs, runner.graphs = runner.graphs, {}
    try:
        yield
    finally:
        runner.graphs = graphs


def step_seconds(runner: ModelRunner, seqs, steps: int) -> float:
    """decode_speed.timed_decode; on a CPU (smoke runs) without its CUDA synchronisation."""
    if runner.device.type == "cuda":
        return timed_decode(runner, seqs, steps)
    with mock.patch.object(torch.cuda, "synchronize", lambda: None):
        return timed_decode(runner, seqs, steps)


def greedy_step(runner: ModelRunner, seqs: list) -> None:
    """One decode step as the engine runs it: the host reads the sampled tokens."""
    runner.run(seqs).argmax(-1).tolist()


def profile_batch(runner: ModelRunner, name: str, batch: int, args) -> dict:
    """Eager kernels of one step beside the timed graph step (the graph's own profile apart)."""
    on_gpu = runner.device.type == "cuda"
    num_layers = runner.model.config.num_hidden_layers
    blocks_per_seq = math.ceil(args.max_len / BLOCK)
    step = partial(greedy_step, runner, make_seqs(batch, args.context, blocks_per_seq))
    with eager(runner):
        eager_us = 1e6 * step_seconds(runner, make_seqs(batch, args.context, blocks_per_seq), 3)
        eager_prof = profile_steps(step, args.profile_steps, on_gpu)
    if on_gpu and not eager_prof.kernels:
        raise RuntimeError(
            "the profiler saw no GPU kernels (CUPTI can stop collecting after a session that ran "
            "before a graph capture): profile one model per process"
        )
    timed_seqs = make_seqs(batch, args.context, blocks_per_seq)
    graph_us = 1e6 * step_seconds(runner, timed_seqs, args.timed_steps)
    return {
        "model": name,
        "batch": batch,
        "context": args.context,
        "step_timing": "cuda graph replay" if runner.graphs else "eager (no graphs)",
        "eager_step_us": eager_us,
        **step_fields(eager_prof, num_layers, graph_us, on_gpu),
    }


def step_fields(prof: Profile, num_layers: int, step_us: float, on_gpu: bool) -> dict:
    """A profile's entries shared by decode and prefill steps: per-step launches, kernel and copy
    time, what is left of `step_us` (gaps + host), and the kernel table."""
    launches, kernel_us = prof.per_step(prof.kernels)
    copies, copy_us = prof.per_step(prof.copies)
    return {
        "num_layers": num_layers,
        "event_unit": "GPU kernels" if on_gpu else "CPU ops, self time",
        "step_us": step_us,
        "launches_per_step": launches,
        "kernel_us_per_step": kernel_us,
        "copies_per_step": copies,
        "copy_us_per_step": copy_us,
        "gaps_and_host_us": step_us - kernel_us - copy_us,
        "kernels": [asdict(row) for row in kernel_table(prof, num_layers, step_us)],
        "graph_profile": None,
    }


def parse_prefill(text: str) -> list[tuple[int, int]]:
    """'8x1024,1x8192' -> [(8, 1024), (1, 8192)]: prompts x tokens per prompt."""
    shapes = []
    for item in filter(None, text.split(",")):
        prompts, _, length = item.partition("x")
        if not (prompts.isdigit() and length.isdigit() and int(prompts) and int(length)):
            raise ValueError(f"--prefill wants PROMPTSxTOKENS, e.g. 8x1024; got {item!r}")
        shapes.append((int(prompts), int(length)))
    return shapes


def prefill_flops(cfg, prompts: int, length: int) -> float:
    """Matmul FLOPs of one prefill step of `prompts` fresh prompts of `length` tokens: the
    attention and router projections, top-k experts (gate_up and down), QK^T and PV over the
    causal (or sliding) context, and the unembedding of each prompt's last token."""
    tokens = prompts * length
    hidden, heads, dim = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    kv_heads = cfg.num_key_value_heads
    projections = hidden * (heads + 2 * kv_heads) * dim + heads * dim * hidden
    router = hidden * cfg.num_local_experts
    experts = cfg.num_experts_per_tok * 3 * hidden * cfg.intermediate_size  # gate_up 2x, down 1x
    flops = 0.0
    for layer in range(cfg.num_hidden_layers):
        window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else length
        keys = sum(min(i + 1, window) for i in range(length))  # per prompt, over its positions
        flops += 2 * tokens * (projections + router + experts)
        flops += 2 * 2 * heads * dim * keys * prompts  # QK^T and PV
    return flops + 2 * prompts * hidden * cfg.vocab_size


def profile_prefill(runner: ModelRunner, name: str, prompts: int, length: int, args) -> dict:
    """Kernels of one prefill step of `prompts` fresh prompts of `length` tokens (eager, as the
    engine runs prefill), beside its wall time and matmul rate."""
    on_gpu = runner.device.type == "cuda"
    cfg = runner.model.config
    seqs = make_seqs(prompts, 0, math.ceil(args.max_len / BLOCK))
    generator = torch.Generator().manual_seed(0)
    for seq in seqs:
        seq.token_ids = torch.randint(0, cfg.vocab_size, (length,), generator=generator).tolist()
    step = partial(greedy_step, runner, seqs)
    step_us = 1e6 * median_seconds(step, args.timed_steps)
    prof = profile_steps(step, args.profile_steps, on_gpu)
    flops = prefill_flops(cfg, prompts, length)
    return {
        "model": name,
        "batch": prompts,
        "prefill_tokens": prompts * length,
        "context": length,
        "step_timing": "eager prefill",
        "eager_step_us": step_us,
        "matmul_tflop": flops / 1e12,
        "tflops": flops / step_us / 1e6,
        **step_fields(prof, cfg.num_hidden_layers, step_us, on_gpu),
    }


def median_seconds(step: Callable[[], object], steps: int) -> float:
    """Median seconds of `steps` runs of `step` after two warm-up runs."""
    times = []
    for run in range(2 + steps):
        start = time.perf_counter()
        step()  # greedy_step reads the picks on the host: the step has finished
        if run >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def graph_profile(step: Callable[[], object], steps: int, graph_us: float) -> dict:
    """The graph steps' own events; launches_per_step 0 means the profiler saw none inside."""
    prof = profile_steps(step, steps, on_gpu=True)
    launches, kernel_us = prof.per_step(prof.kernels)
    _, copy_us = prof.per_step(prof.copies)
    return {
        "launches_per_step": launches,
        "kernel_us_per_step": kernel_us,
        "copy_us_per_step": copy_us,
        "gaps_and_host_us": graph_us - kernel_us - copy_us if launches else None,
    }


def print_profile(result: dict, top: int) -> None:
    step_us = result["step_us"]
    if "prefill_tokens" in result:
        what = (
            f"prefill {result['batch']}x{result['context']} ({result['prefill_tokens']} tokens, "
            f"{result['matmul_tflop']:.3g} TFLOP of matmuls at {result['tflops']:.3g} TFLOP/s)"
        )
    else:
        what = f"batch {result['batch']}, context {result['context']}"
    print(
        f"\n{result['model']} {what}: step "
        f"{step_us / 1e3:.3f} ms ({result['step_timing']}), eager {result['eager_step_us'] / 1e3:.2f}"
        f" ms; {result['launches_per_step']:.0f} {result['event_unit']} per step, "
        f"{result['kernel_us_per_step'] / 1e3:.3f} ms, {result['copies_per_step']:.0f} copies "
        f"{result['copy_us_per_step']:.0f} us; gaps + host {result['gaps_and_host_us'] / 1e3:.3f} ms"
    )
    print(f"{'kernel':60s} calls/step calls/layer  us/call  us/step us/layer  %step")
    rows = result["kernels"]
    for row in rows[:top]:
        print(
            f"{row['name'][:60]:60s} {row['calls_per_step']:10.1f} {row['calls_per_layer']:11.2f} "
            f"{row['us_per_call']:8.2f} {row['us_per_step']:8.1f} {row['us_per_layer']:8.2f} "
            f"{100 * row['share_of_step']:5.1f}%"
        )
    rest = rows[top:]
    if rest:
        us = sum(row["us_per_step"] for row in rest)
        print(f"{f'({len(rest)} more)':60s} {'':10s} {'':11s} {'':8s} {us:8.1f}")
    gaps = result["gaps_and_host_us"]
    print(
        f"{'gaps + host':60s} {'':10s} {'':11s} {'':8s} {gaps:8.1f} {'':8s} {100 * gaps / step_us:5.1f}%"
    )


def print_graph_profile(graph: dict) -> None:
    if not graph["launches_per_step"]:
        print("inside the graph: the profiler saw no kernels of the replays")
        return
    print(
        f"inside the graph: {graph['launches_per_step']:.0f} kernels per step, "
        f"{graph['kernel_us_per_step'] / 1e3:.3f} ms, copies {graph['copy_us_per_step']:.0f} us;"
        f" gaps + host {graph['gaps_and_host_us'] / 1e3:.3f} ms"
    )


def bench_model(name: str, args: argparse.Namespace) -> list[dict]:
    loaded = load_dummy(name, args.max_len, args.ops)
    most_seqs = max(args.batch_sizes + [prompts for prompts, _ in args.prefill])
    most_tokens = max(args.batch_sizes + [prompts * length for prompts, length in args.prefill])
    runner = ModelRunner(
        loaded.model,
        num_blocks=1 + 2 * most_seqs * math.ceil(args.max_len / BLOCK),
        block_size=BLOCK,
        max_num_seqs=most_seqs,
        max_num_batched_tokens=most_tokens,
        cuda_graphs=not args.no_cuda_graphs and bool(args.batch_sizes),
        graph_sizes=tuple(args.batch_sizes),
        kv_cache_dtype=kv_cache_dtype(args.kv_cache_dtype, loaded.model.dtype, loaded.model.device),
    )
    fill_random(runner.kv_cache)  # random KV: reading it costs what a real context costs
    results = []
    for batch in args.batch_sizes:
        result = profile_batch(runner, Path(name).name, batch, args)
        print_profile(result, args.top)  # before the graph session, in case that one fails
        if runner.graphs and not args.no_graph_profile:
            seqs = make_seqs(batch, args.context, math.ceil(args.max_len / BLOCK))
            step = partial(greedy_step, runner, seqs)
            result["graph_profile"] = graph_profile(step, args.profile_steps, result["step_us"])
            print_graph_profile(result["graph_profile"])
        results.append(result)
    for prompts, length in args.prefill:
        result = profile_prefill(runner, Path(name).name, prompts, length, args)
        print_profile(result, args.top)
        results.append(result)
    del runner, loaded
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=None, help="default gpt-oss-120b,gpt-oss-20b")
    parser.add_argument("--batch-sizes", default=None, help="default 1,64")
    parser.add_argument("--context", type=int, default=None, help="default 1024")
    parser.add_argument("--profile-steps", type=int, default=None, help="default 5")
    parser.add_argument("--timed-steps", type=int, default=None, help="default 64")
    parser.add_argument("--top", type=int, default=30, help="kernels printed (the JSON has all)")
    parser.add_argument("--ops", default="auto")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES])
    parser.add_argument(
        "--no-graph-profile", action="store_true", help="skip profiling the graph replays"
    )
    parser.add_argument(
        "--prefill", default="", help="prefill steps to profile, PROMPTSxTOKENS[,...] (8x1024)"
    )
    parser.add_argument("--smoke", action="store_true", help="mini model, tiny shapes (CPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.prefill = parse_prefill(args.prefill)
    if args.prefill and args.batch_sizes is None:
        args.batch_sizes = ""  # prefill alone unless decode batches are asked for too
    defaults = {"batch_sizes": "1,64", "context": 1024, "profile_steps": 5, "timed_steps": 64}
    fill_defaults(args, defaults, SMOKE)
    args.batch_sizes = [int(b) for b in str(args.batch_sizes).split(",") if b]
    # as decode_speed.py sizes it: the timed steps advance the context
    longest = max([args.context] + [length for _, length in args.prefill])
    args.max_len = longest + args.timed_steps + 16
    return args


def profile_in_child(name: str, args: argparse.Namespace) -> list[dict]:
    """Profile one model in a process of its own: a profiler session that ran before a CUDA-graph
    capture can leave CUPTI collecting no kernels for the rest of the process, so the next model's
    graphs must not be captured where the previous model was profiled."""
    flags = [
        *("--models", name, "--batch-sizes", ",".join(map(str, args.batch_sizes))),
        *("--kv-cache-dtype", args.kv_cache_dtype),
        *("--context", str(args.context), "--profile-steps", str(args.profile_steps)),
        *("--timed-steps", str(args.timed_steps), "--top", str(args.top), "--ops", args.ops),
        *(["--no-cuda-graphs"] if args.no_cuda_graphs else []),
        *(["--no-graph-profile"] if args.no_graph_profile else []),
        *("--prefill", ",".join(f"{p}x{n}" for p, n in args.prefill)),
    ]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json"
        child = subprocess.run([sys.executable, __file__, *flags, "--json", str(path)])
        if child.returncode or not path.is_file():
            print(f"{name}: the profile run failed (exit {child.returncode})", flush=True)
            return []
        return json.loads(path.read_text())["profiles"]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if torch.cuda.is_available() and len(args.models) > 1:
        results = [row for name in args.models for row in profile_in_child(name, args)]
    else:
        results = [row for name in args.models for row in bench_model(name, args)]
    result = {**run_info(args), "profiles": results}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
