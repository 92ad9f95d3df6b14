"""Programmatic dependent launch (PDL): let a decode step's next kernel start before this one ends.

A batch-1 decode step of gpt-oss-120b is about 400 kernels, most of them a few microseconds long
(benchmarks/step_profile.py, 2026-12-02: norms 2.0 us, routing 3.3 us, RoPE 2.3 us). Each pays its
launch and the first trip to memory before doing work. With PDL (sm_90+), a kernel launched with
`launch_pdl=True` may be scheduled while its predecessor still runs; it must then execute
`griddepcontrol.wait` before it touches memory the predecessor writes, and it signals with
`griddepcontrol.launch_dependents` that its own successor may be scheduled. `wait` below does
both, in that order. What a kernel does before its wait (compute addresses, read weights, which
no kernel writes) overlaps the predecessor.

The contract every PDL kernel here keeps: no load of activations, caches or metadata and no store
of any kind before `wait`. Then each kernel's predecessor has finished before it reads or writes,
and by induction so have all earlier kernels (a kernel launched without PDL is ordered as usual).
One exception, argued where it is made: the MoE down GEMV reads the routing's expert ids before its
wait. Routing ran two kernels earlier, and gate_up (in between) lets down start only after its own
wait, so those ids are final; down reads them through L2 (.cg). The wait completes at once when the
kernel was launched without PDL, so the same binary is correct either way. Stream capture keeps PDL edges in CUDA graphs.

`enabled(device)` says whether to launch with PDL: CUDA, compute capability 9.0+, not the CPU
interpreter, and `ENABLED` (a switch for A/B measurements and debugging).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENABLED = os.environ.get("GOSSAMER_PDL", "1") != "0"


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL (and so compile their waits)."""
    if not ENABLED or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return (
        _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9
    )


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a kernel launch: the PDL constexpr and, when on, Triton's launch flag."""
    if enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the previous kernel in the stream has finished and its writes are visible, then
    let the next kernel be scheduled (it starts once every program of this one got here, and then
    waits in its own `wait` for this kernel to finish)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask for the 128-byte lines at `ptrs` (a tensor of in-bounds addresses, one per line) to be
    brought into L2. Nothing waits for them and nothing is written: weights may be fetched this way
    before `wait`, so their trip from HBM overlaps the previous kernel."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


# Bytes per bulk L2 prefetch request (`prefetch_bulk`): one request per lane, issued by the TMA unit.
BULK_CHUNK = tl.constexpr(4096)
# Kernels that contain inline PTX run plain-Triton twins of it in the CPU interpreter.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def prefetch_bulk(base, nbytes, part, parts, LANES: tl.constexpr, EVICT_LAST: tl.constexpr = False):
    """Ask for bytes [0, nbytes) at `base` to be brought into L2; this program sends its share,
    part `part` of `parts`, as BULK_CHUNK-byte requests (`cp.async.bulk.prefetch.L2`, sm_90), up to
    LANES at a time. Nothing waits for them and nothing is written, so a kernel may send the
    weights of a LATER kernel this way: they then stream from HBM while latency-bound kernels in
    between leave it idle. `nbytes` must be a multiple of 16 (the instruction's unit).
    EVICT_LAST: the lines get L2's evict-last priority (so that a stream of other data read before
    them does not push them out; their reader should load them as evict-first)."""
    start = base.to(tl.pointer_type(tl.int8))
    first, end = bulk_share(nbytes, part, parts)
    for step in range(first, end, LANES):
        offset, size, active = bulk_requests(nbytes, step, end, LANES)
        if _INTERPRETED:
            # the twin touches each request's first and last byte (the addresses are in bounds)
            tl.load(start + offset, mask=active)
            tl.load(start + offset + size - 1, mask=active)
        elif EVICT_LAST:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b64 policy; setp.ne.b32 p, $3, 0; "
                "createpolicy.fractional.L2::evict_last.b64 policy, 1.0; "
                "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, policy; } "
                "mov.u32 $0, 0;",
                "=r,l,r,r", [start + offset, size, active.to(tl.int32)],
                dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $3, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], $2; } mov.u32 $0, 0;",
                "=r,l,r,r", [start + offset, size, active.to(tl.int32)],
                dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def bulk_share(nbytes, part, parts):
    """[first, end) chunk indices of `part`'s share: whole chunks, as even as cdiv makes them."""
    chunks = tl.cdiv(nbytes, BULK_CHUNK)
    per_part = tl.cdiv(chunks, parts)
    first = part * per_part
    return first, tl.minimum(first + per_part, chunks)


@triton.jit
def bulk_requests(nbytes, step, end, LANES: tl.constexpr):
    """(byte offset, size, active) of chunks step .. step + LANES - 1; lanes at or past `end` are
    inactive and carry the last chunk's (in-bounds) address."""
    chunk = step + tl.arange(0, LANES)
    active = chunk < end
    chunk = tl.minimum(chunk, tl.cdiv(nbytes, BULK_CHUNK) - 1).to(tl.int64)
    offset = chunk * BULK_CHUNK
    return offset, tl.minimum(nbytes - offset, BULK_CHUNK).to(tl.int32), active


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
