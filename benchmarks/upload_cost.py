"""Host time of a step's input upload: one copy of StepBuffers' prefix against one copy per input.

What the runner did before 33f601f, reproduced here on the same sizes: a non-blocking copy per
input (ids, positions, each group's slots, query starts, lengths) and the block tables through a
pinned staging buffer into a strided device slice (a device temporary, then a device-to-device
copy). What it does now: `StepBuffers.upload`, one copy. Both are timed in one process, in
alternating rounds (the host's speed drifts between processes by up to 30% on the H200 machine),
as the host's wall time per upload with nothing else queued behind it; the GPU is synchronized
between rounds, not inside them.

    python benchmarks/upload_cost.py [--batch-sizes 1,8,64] [--context 1024] [--rounds 5]

Then, at batch 1, the host time of `StepBuffers.advanced` (model_runner.ADVANCE_IN_GRAPH: the
host's copy of the device's inputs moved on a token after each replay) with its views of that
copy carved once a layout (now), and carved anew every step (before the twentieth session).

(`--device cpu` runs it without a GPU: copies are then plain memcpys, for a smoke test.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gossamer.runner.host_copy import host_buffer
from gossamer.runner.step_buffers import StepBuffers

GROUPS, BLOCK_SIZE = 2, 16


class PerInputUploads:
    """The former upload: persistent host and device buffers per input, one copy each."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, device) -> None:
        shapes = {
            "input_ids": ((max_tokens,), torch.int64),
            "positions": ((max_tokens,), torch.int64),
            "slot_mapping": ((GROUPS, max_tokens), torch.int64),
            "block_tables": ((GROUPS, max_seqs, max_blocks), torch.int32),
            "query_start_loc": ((max_seqs + 1,), torch.int32),
            "seq_lens": ((max_seqs,), torch.int32),
        }
        self.pinned = {
            name: host_buffer(shape, dtype, device) for name, (shape, dtype) in shapes.items()
        }
        self.dev = {name: tensor.to(device, copy=True) for name, tensor in self.pinned.items()}
        self.packed_tables = host_buffer((GROUPS * max_seqs * max_blocks,), torch.int32, device)

    def upload(self, tokens: int, seqs: int, width: int) -> None:
        dev, pinned = self.dev, self.pinned
        for name in ("input_ids", "positions"):
            dev[name][:tokens].copy_(pinned[name][:tokens], non_blocking=True)
        for g in range(GROUPS):
            dev["slot_mapping"][g, :tokens].copy_(
                pinned["slot_mapping"][g, :tokens], non_blocking=True
            )
        packed = self.packed_tables[: GROUPS * seqs * width].view(GROUPS, seqs, width)
        packed.numpy()[...] = self.pinned["block_tables"].numpy()[:, :seqs, :width]
        dev["block_tables"][:, :seqs, :width].copy_(packed, non_blocking=True)
        for name, length in (("query_start_loc", seqs + 1), ("seq_lens", seqs)):
            dev[name][:length].copy_(pinned[name][:length], non_blocking=True)


def host_us(upload, tokens: int, seqs: int, width: int, calls: int, device) -> float:
    """Median of 5 batches of `calls` uploads: host microseconds per upload."""
    samples = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            upload(tokens, seqs, width)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    synchronize(device)
    return statistics.median(samples)


def advance_us(calls: int, context: int, max_blocks: int, carve_each_step: bool) -> float:
    """Host microseconds of one batch-1 `StepBuffers.advanced` (median of 5 batches of calls)."""
    buffers = StepBuffers(1, 1, GROUPS, max_blocks, torch.device("cpu"), track_device=True)
    host, _ = buffers.views(1, 1)
    host["positions"][0], host["seq_lens"][0] = context, context + 1
    host["slot_mapping"][:, 0] = context
    host["block_tables"][:, 0, :] = range(max_blocks)
    buffers.upload(1, 1, -(-(context + calls * 5) // BLOCK_SIZE))
    on_device = torch.from_numpy(buffers.on_device)

    def step(*_) -> None:
        if carve_each_step:  # what _device_views did before it kept its views
            buffers._carve(on_device, 1, 1)
        buffers.advanced(1, 1, BLOCK_SIZE)

    return host_us(step, 1, 1, 0, calls, torch.device("cpu"))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-seqs", type=int, default=256)
    args = parser.parse_args()
    device = torch.device(args.device)
    max_tokens, max_seqs = args.max_tokens, args.max_seqs
    max_blocks = -(-args.max_model_len // BLOCK_SIZE)
    width = -(-args.context // BLOCK_SIZE)
    ways = {
        "per_input": PerInputUploads(max_tokens, max_seqs, max_blocks, device).upload,
        "one_copy": StepBuffers(max_tokens, max_seqs, GROUPS, max_blocks, device).upload,
    }
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, upload in ways.items():
                times[name].append(host_us(upload, batch, batch, width, args.calls, device))
        row = {"batch": batch, "context": args.context}
        row |= {f"{name}_us": statistics.median(values) for name, values in times.items()}
        rows.append(row)
        print(
            f"batch {batch:4d}: per input {row['per_input_us']:6.1f} us, one copy {row['one_copy_us']:6.1f} us per upload (host)"
        )
    blocks = -(-args.context // BLOCK_SIZE) + args.calls  # room for 5 x calls tokens
    advance = {
        f"{name}_us": statistics.median(
            advance_us(args.calls, args.context, blocks, each) for _ in range(args.rounds)
        )
        for name, each in (("advance_views_kept", False), ("advance_views_carved", True))
    }
    print(
        f"advance, batch 1: views kept {advance['advance_views_kept_us']:6.1f} us, carved each "
        f"step {advance['advance_views_carved_us']:6.1f} us (host)"
    )
    if args.json:
        with open(args.json, "w") as f:
            name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
            json.dump(
                {"gpu": name, "torch": torch.__version__, "rows": rows, "advance": advance},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
