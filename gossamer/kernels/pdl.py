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
Three exceptions, argued where they are made. (1) The MoE down GEMV reads the routing's expert ids
before its wait. Routing ran two kernels earlier, and gate_up (in between) lets down start only
after its own wait, so those ids are final; down reads them through L2 (.cg); without a routing kernel (moe_mxfp4.ROUTE_IN_EXPERTS) it reads
the router logits instead, by the same argument one launch further back. (2) The same for
gate_up with EARLY: it reads the router logits, written by the kernel before the routing, and
picks its expert with the routing's own top-k. (3) Decode attention
with its fused KV write (attention.EARLY_KV) reads the step's metadata and its first key tile
before its wait: the metadata was uploaded before the step's first kernel, and the layer's cache
was last written by earlier steps, except the new token's slot, which that kernel itself writes
and patches in registers. The wait completes at once when a kernel was launched without PDL, so
the same binary is correct either way. Stream capture keeps PDL edges in CUDA graphs.

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


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
