"""Hardware counters for the kernels of one eager decode step (issue #8), read by Nsight Compute.

    bash benchmarks/ncu_step.sh gpt-oss-120b 64 DIR      # on the H200: ncu, then the table
    python benchmarks/ncu_step.py summarize DIR/ncu.csv  # the table from ncu's CSV again
    python benchmarks/ncu_step.py run --smoke            # CPU: the driver on the built-in model

Why: ten sessions of timing variants (BENCHMARKS.md, benchmarks/NOTES.md) left two questions that
only counters answer. The grouped MXFP4 MoE at 64 tokens takes 674 us a layer against a 345 us
byte floor while its instructions (3.2 a weight) would issue in ~265 us: what do its warps wait
on? And at batch 1 every kernel of a layer runs 1.5-13x its byte floor (decode attention 6.8 us
against 0.5): latency of which dependency? The device's Firecracker runtime lets ncu read the
counters (.library/device/KINDS.md; `--clock-control none`, as METHOD.md asks).

`run` builds the model as step_profile.py does (dummy weights, random KV, every sequence at
--context tokens), runs eager steps (no CUDA graphs: ncu profiles kernel launches) until the
Triton kernels are compiled, then one step between cudaProfilerStart and cudaProfilerStop, so
that `ncu --profile-from-start off` sees exactly one step's kernels.

`summarize` reads `ncu --csv --page raw` (one row per kernel launch, a row of units after the
header) and prints per kernel name, in order of total time: launches, microseconds per launch and
in all, DRAM throughput and SM throughput (% of peak), achieved occupancy, issue slots busy,
registers per thread, and the warp stall reasons that cost most (cycles per issued instruction,
`smsp__average_warps_issue_stalled_*_per_issue_active`). A kernel whose DRAM throughput is far
below peak with long_scoreboard on top waits on its loads (too few bytes in flight); one with
math_pipe_throttle or high issue use is instruction bound; wait/barrier point at dependencies
inside the kernel.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import BLOCK, make_seqs  # noqa: E402
from throughput import load_dummy  # noqa: E402

from gossamer.models import default_model_path  # noqa: E402
from gossamer.runner.model_runner import ModelRunner  # noqa: E402

WARMUP_STEPS = 3  # eager steps before the profiled one: every Triton kernel compiled
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
BYTE_RATE_UNITS = {
    "byte/s": 1e-9,
    "Kbyte/s": 1e-6,
    "Mbyte/s": 1e-3,
    "Gbyte/s": 1.0,
    "Tbyte/s": 1e3,
}  # -> GB/s
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
# column -> what the table calls it (ncu 2025.3's raw names, checked against its CSV on the H200;
# a missing column prints as nan)
DRAM_BYTES_PER_S = "dram__bytes.sum.per_second"
COLUMNS = {
    "gpu__time_duration.sum": "us",
    DRAM_BYTES_PER_S: "GB/s",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
    "launch__registers_per_thread": "regs",
}
# How busy each SM pipe was (% of peak over the kernel): ncu's InstructionStats section
# (`--section InstructionStats`) adds them; the table shows the ones present (`summarize --pipes`).
PIPES = {
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed": "alu%",
    "sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_elapsed": "fmah%",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed": "fma%",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor%",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed": "lsu%",
    "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed": "unif%",
}


# ---- the step ------------------------------------------------------------------------------------


def run_step(model: str, batch: int, context: int) -> None:
    """Warm-up eager steps, then one step inside the profiler's range."""
    on_gpu = torch.cuda.is_available()
    max_len = context + 16
    loaded = load_dummy(model, max_len)
    blocks_per_seq = math.ceil(max_len / BLOCK)
    runner = ModelRunner(
        loaded.model,
        num_blocks=1 + 2 * batch * blocks_per_seq,
        block_size=BLOCK,
        max_num_seqs=batch,
        max_num_batched_tokens=batch,
        cuda_graphs=False,
    )
    runner.kv_cache.normal_(0, 0.5)
    seqs = make_seqs(batch, context, blocks_per_seq)
    for _ in range(WARMUP_STEPS):
        runner.run(seqs).argmax(-1).tolist()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    runner.run(seqs).argmax(-1).tolist()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled one eager step: {model}, batch {batch}, context {context}")


# ---- the table -----------------------------------------------------------------------------------


@dataclass
class KernelStats:
    name: str
    launches: int = 0
    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def mean(self, column: str) -> float:
        found = self.values.get(column)
        return sum(found) / len(found) if found else math.nan

    @property
    def total_us(self) -> float:
        return self.launches * self.mean("gpu__time_duration.sum")

    def top_stalls(self, count: int) -> list[tuple[str, float]]:
        stalls = [
            (column[len(STALL_PREFIX) : -len(STALL_SUFFIX)], self.mean(column))
            for column in self.values
            if column.startswith(STALL_PREFIX) and column.endswith(STALL_SUFFIX)
        ]
        return sorted(stalls, key=lambda item: -item[1])[:count]


def read_raw_csv(path: Path) -> list[KernelStats]:
    """Kernels by name and grid from `ncu --csv --page raw` (one kernel serves several problems,
    e.g. the O projection and the router); durations in microseconds whatever the unit, DRAM
    throughput in GB/s."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if '"Kernel Name"' in line)
    rows = list(csv.reader(lines[start:]))
    header, rows = rows[0], rows[1:]
    name_at = header.index("Kernel Name")
    grid_at = header.index("Grid Size") if "Grid Size" in header else None
    units = rows[0] if rows and not rows[0][name_at] else [""] * len(header)
    by_name: dict[str, KernelStats] = {}
    for row in rows:
        if len(row) != len(header) or not row[name_at]:
            continue  # the units row, a log line
        name = row[name_at] if grid_at is None else f"{row[name_at][:36]} {row[grid_at]}"
        stats = by_name.setdefault(name, KernelStats(name))
        stats.launches += 1
        for column, unit, text in zip(header, units, row, strict=True):
            value = _number(text)
            if value is None:
                continue
            if column == "gpu__time_duration.sum":
                value *= TIME_UNITS.get(unit, 1e-3)  # ncu's default unit: nanoseconds
            elif column == DRAM_BYTES_PER_S:
                value *= BYTE_RATE_UNITS.get(unit, 1e-9)  # ncu's default: bytes per second
            stats.values[column].append(value)
    return sorted(by_name.values(), key=lambda stats: -stats.total_us)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def print_table(
    kernels: list[KernelStats], top: int, stalls: int, pipes: bool = False, match: str = ""
) -> None:
    total = sum(stats.total_us for stats in kernels)
    print(f"{len(kernels)} kernels, {sum(k.launches for k in kernels)} launches, {total:.1f} us")
    columns = dict(COLUMNS)
    if pipes:  # (those the CSV has)
        columns |= {c: label for c, label in PIPES.items() if any(c in k.values for k in kernels)}
    heads = "".join(f"{label:>8s}" for label in columns.values())
    print(f"{'kernel':48s} {'launches':>8s} {'total us':>9s}{heads}  stalls (cycles per issue)")
    for stats in kernels[:top]:
        cells = "".join(f"{stats.mean(column):8.1f}" for column in columns)
        worst = ", ".join(f"{name} {value:.1f}" for name, value in stats.top_stalls(stalls))
        print(f"{stats.name[:48]:48s} {stats.launches:8d} {stats.total_us:9.1f}{cells}  {worst}")
    if match:
        print_matching(kernels[:top], match)


def print_matching(kernels: list[KernelStats], pattern: str) -> None:
    """Every raw column whose name matches `pattern`, a line per kernel and column (e.g. the
    shared-memory bank conflicts of --section MemoryWorkloadAnalysis_Tables)."""
    for stats in kernels:
        for column in sorted(c for c in stats.values if re.search(pattern, c)):
            print(f"  {stats.name[:48]:48s} {column:70s} {stats.mean(column):14.1f}")


# ---- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one eager step inside the profiler's range")
    run.add_argument("--model", default="gpt-oss-120b")
    run.add_argument("--batch", type=int, default=1)
    run.add_argument("--context", type=int, default=1024)
    run.add_argument("--smoke", action="store_true", help="the built-in model on the CPU")
    summarize = commands.add_parser("summarize", help="the table from ncu's CSV")
    summarize.add_argument("csv", type=Path)
    summarize.add_argument("--top", type=int, default=30)
    summarize.add_argument("--stalls", type=int, default=4)
    summarize.add_argument("--pipes", action="store_true", help="pipe use (InstructionStats)")
    summarize.add_argument("--match", default="", help="also print raw columns matching this regex")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.smoke:
            torch.set_num_threads(1)
            args.model, args.context = str(default_model_path()), 32
        run_step(args.model, args.batch, args.context)
    else:
        print_table(read_raw_csv(args.csv), args.top, args.stalls, args.pipes, args.match)


if __name__ == "__main__":
    main()
