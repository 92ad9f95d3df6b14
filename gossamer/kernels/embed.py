"""The embedding lookup, with tokens that the previous step picked on the device.

out[t] = weight[id_t], id_t = input_ids[t], or fed_ids[t] where input_ids[t] is negative. The
negative placeholder is how the runner feeds a step the greedy picks that the previous step's
graph left in its greedy buffer (ModelRunner's `greedy_ids`), without a device-to-device copy of
them into the input buffer: the host writes -1 for those tokens with the step's other inputs.
Its twin is TorchOps.embed (torch.where, then indexing).

At batch 1 this is the first kernel of a decode step; torch's indexing kernel took ~5 us there, and
its launch is not programmatic (PDL), so the next kernel could not start early. TritonOps uses this
kernel where the runner passes fed ids (model_runner.GREEDY_IN_GRAPH, off until measured); other
steps keep torch's indexing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gossamer.kernels import pdl


def embed(
    input_ids: torch.Tensor,  # [T] int64
    weight: torch.Tensor,  # [vocab, H]
    fed_ids: torch.Tensor | None = None,  # [>= T] int64: ids of the tokens whose input id is < 0
) -> torch.Tensor:
    """weight[ids] [T, H], ids as the module doc says."""
    num_tokens, hidden = input_ids.shape[0], weight.shape[1]
    out = torch.empty(num_tokens, hidden, dtype=weight.dtype, device=weight.device)
    if num_tokens == 0:
        return out
    block = triton.next_power_of_2(hidden)
    _embed_kernel[(num_tokens,)](
        input_ids, input_ids if fed_ids is None else fed_ids, weight, out, hidden,
        weight.stride(0), HAS_FED=fed_ids is not None, BLOCK_H=block,
        num_warps=max(1, min(8, block // 512)), **pdl.launch_options(weight.device),
    )  # fmt: skip
    return out


@triton.jit
def _embed_kernel(
    ids_ptr,
    fed_ptr,
    weight_ptr,
    out_ptr,
    H,
    stride_w,
    HAS_FED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0)
    pdl.wait(PDL)  # the ids come from the step's upload or the previous step's pick
    token_id = tl.load(ids_ptr + token)
    if HAS_FED:
        if token_id < 0:
            token_id = tl.load(fed_ptr + token)
    cols = tl.arange(0, BLOCK_H)
    row = tl.load(weight_ptr + token_id.to(tl.int64) * stride_w + cols, mask=cols < H)
    tl.store(out_ptr + token.to(tl.int64) * H + cols, row, mask=cols < H)
