"""Host-side cost of one engine step with a null model: schedule, build inputs, sample, update.

    python benchmarks/engine_step_overhead.py [--running 1,64,256] [--json out.json]

The model does no work (it returns zeros), so the time is what the engine spends on the CPU around
a forward pass; at small batch on a GPU this overhead is what limits decode speed. Each running
request decodes with 1k tokens of context (64 blocks of 16 per cache group).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.presets import preset
from gossamer.sampling_params import SamplingParams


class NullModel:
    """Quacks like GptOssForCausalLM for the runner, but computes nothing."""

    def __init__(self, vocab: int = 1024) -> None:
        self.config = preset("gpt-oss-120b")
        self.max_model_len = 4096
        self.device = torch.device("cpu")
        self.dtype = torch.bfloat16
        self.num_cache_groups = 2
        self.vocab = vocab

        class _Ops:
            name = "null"

        self.ops = _Ops()

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype=None) -> torch.Tensor:
        return torch.empty(0)

    def __call__(self, input_ids, positions, metadata, kv_cache, fed_ids=None) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], 1)

    def compute_logits(
        self, hidden: torch.Tensor, greedy_out: torch.Tensor | None = None, advance=None
    ) -> torch.Tensor:
        if greedy_out is not None:
            greedy_out.zero_()  # the argmax of all-zero logits
        if advance is not None:  # (model_runner.ADVANCE_IN_GRAPH: as the real model's graphs)
            advance.apply()
        return torch.zeros(hidden.shape[0], self.vocab)


def measure(num_running: int, steps: int) -> dict:
    config = EngineConfig(max_num_seqs=num_running, num_blocks=num_running * 2 * 80 + 1)
    engine = EngineCore(NullModel(), None, config)
    params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
    for i in range(num_running):
        engine.add_request(str(i), list(range(1, 1025)), params)
    while engine.scheduler.num_waiting or any(
        not choice.request.output_token_ids for choice in engine.choices.values()
    ):
        engine.step()  # prefill everyone first
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return {
        "running": num_running,
        "median_ms": 1e3 * statistics.median(times),
        "p90_ms": 1e3 * sorted(times)[int(0.9 * len(times))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--running", default="1,64,256")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    # Host-side work is what is measured: keep torch's tiny CPU ops off its thread pool.
    torch.set_num_threads(1)
    rows = [measure(int(n), args.steps) for n in args.running.split(",")]
    print("running  median_ms  p90_ms")
    for row in rows:
        print(f"{row['running']:7d}  {row['median_ms']:9.3f}  {row['p90_ms']:6.3f}")
    if args.json:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
