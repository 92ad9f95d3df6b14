"""GPU sampling without host round trips: greedy, temperature, top-k, top-p, min-p, seeded.

API (one function; every per-request parameter is a [N] tensor on the logits' device, so a batch
mixes requests freely and nothing is read back to the host):

    sample(logits, temperature, seeds, steps, top_k=None, top_p=None, min_p=None) -> [N] int64

* logits [N, V] float (fp32 or bf16/fp16). NaN counts as -inf.
* temperature [N] float: <= 0 means greedy (argmax, first index on ties; filters are ignored).
* seeds [N] int64 and steps [N] int64: the random stream of a draw is a pure function of
  (seed, step, token id), so a request's tokens never depend on the other rows of the batch or on
  its row index. `steps` must change between the draws of a request (e.g. the number of tokens it
  has generated so far); requests without a user seed can use any per-request random seed.
* top_k [N] int (<= 0 or >= V: off), top_p [N] float (>= 1: off), min_p [N] float (<= 0: off).
  Pass None for a filter no row uses: it skips the filter kernels and their [N, V] workspace.

Definition. With x = logits / temperature and p = softmax(x):
    keep(i) = #{j: x_j > x_i} < top_k  and  sum{p_j: x_j > x_i} < top_p  and  p_i >= min_p * max(p)
and the top token (nothing above it) is always kept. The three filters are applied to the same full
distribution and intersected (top-p is not renormalised after top-k; ties at a boundary are all
kept), as gossamer/runner/sampler.py does. The token is
    argmax over kept i of  x_i + G_i,   G_i = -log(-log(u_i)),  u_i = philox(seed, step, i)
(the Gumbel-max trick, an exact draw from p restricted to the kept set; u_i is Philox4x32-10 keyed
by the seed with counter (i, step), 23 bits + 1/2 over 2^23).

Torch twin: `sample_reference` (same signature) computes exactly this with the same random numbers
(`philox_uniform`); `kept_tokens` returns the kept set. In the interpreter kernel and twin agree token
for token; on a GPU (approximate division, exp and log) they can differ only where two keys tie to
float rounding.

How the kernels find it without sorting: the kept set is upward closed (if i is kept, so is every
more likely token), so draw j = argmax over all tokens of x + G, check j against the filters (one pass
counting and summing the tokens above it) and, if it fails, draw again among the tokens above it with
the same noise. The answer is then argmax of x + G over the kept set regardless of the rounds taken.
Rounds after the first run in one program per row (typically zero or one); after MAX_ROUNDS the row
falls back to its top token, which is always kept.

Kernels (grid): `_chunk_kernel` (N, chunks) max / argmax / sum-exp / best key per 4096-token chunk,
`_select_kernel` (N) merges them; with filters, `_check_kernel` (N, chunks) counts and sums above the
candidate and `_decide_kernel` (N) accepts or continues. The chunk size is fixed, so no reduction
order depends on the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_SIZE = 4096  # tokens per program in the parallel passes; fixed so results ignore the batch
MAX_ROUNDS = 64
_INDEX_SENTINEL = tl.constexpr(2**31 - 1)

# Philox4x32-10 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
# NOTE: our own copy rather than tl.rand, so that the torch twin stays bit-identical whatever
# Triton version runs the kernel.
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
_M0 = tl.constexpr(PHILOX_M0)
_M1 = tl.constexpr(PHILOX_M1)
_W0 = tl.constexpr(PHILOX_W0)
_W1 = tl.constexpr(PHILOX_W1)
_ROUNDS = tl.constexpr(PHILOX_ROUNDS)


# ------------------------------------------------------------------------------------------------
# Triton kernels
# ------------------------------------------------------------------------------------------------


@triton.jit
def _uniform(seed, step, offsets):
    """Philox4x32-10 keyed by the 64-bit seed, counter (token, step lo, step hi, 0) -> (0, 1)."""
    # int64 -> uint32 keeps the low 32 bits, whatever the sign
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = offsets.to(tl.uint32)
    zero = c0 * 0
    c1 = zero + step.to(tl.uint32)
    c2 = zero + (step >> 32).to(tl.uint32)
    c3 = zero
    for _ in tl.static_range(_ROUNDS):
        hi0 = tl.umulhi(c0, _M0)
        lo0 = c0 * _M0
        hi1 = tl.umulhi(c2, _M1)
        lo1 = c2 * _M1
        c0 = hi1 ^ c1 ^ k0
        c1 = lo1
        c2 = hi0 ^ c3 ^ k1
        c3 = lo0
        k0 = k0 + _W0
        k1 = k1 + _W1
    # 23 random bits plus a half: exact in float32 and strictly inside (0, 1)
    return ((c0 >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def _scaled_logits(logits_ptr, offsets, mask, temperature, GREEDY_ROW: tl.constexpr):
    values = tl.load(logits_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
    values = tl.where(values == values, values, float("-inf"))  # NaN -> -inf
    if GREEDY_ROW:
        return values
    return values / temperature


@triton.jit
def _candidate_logit(row_logits, token, temperature):
    """x of one token, computed exactly as `_scaled_logits` computes it."""
    value = tl.load(row_logits + token).to(tl.float32)
    value = tl.where(value == value, value, float("-inf"))
    return value / temperature


@triton.jit
def _argmax_first(values, indices):
    """(max, smallest index holding it) of a block; sentinel index if the block is all -inf/NaN."""
    best = tl.max(values, axis=0)
    index = tl.min(tl.where(values == best, indices, _INDEX_SENTINEL), axis=0)
    return best, index


@triton.jit
def _merge_best(best, index, new_best, new_index):
    """Keep the larger value; on a tie the smaller index (blocks are visited left to right, but
    chunk merges compare indices explicitly)."""
    take = (new_best > best) | ((new_best == best) & (new_index < index))
    return tl.where(take, new_best, best), tl.where(take, new_index, index)


@triton.jit
def _merge_sum_exp(m, s, block_max, block_sum):
    """Combine two (max, sum of exp(x - max)) pairs; -inf maxima carry a zero sum."""
    new_m = tl.maximum(m, block_max)
    safe = tl.where(new_m == float("-inf"), 0.0, new_m)
    return new_m, s * tl.exp(m - safe) + block_sum * tl.exp(block_max - safe)


@triton.jit
def _chunk_kernel(
    logits_ptr,  # [N, V]
    temperature_ptr,  # [N]
    seeds_ptr,  # [N] int64
    steps_ptr,  # [N] int64
    keys_ptr,  # [N, V] float32 workspace (STORE_KEYS)
    chunk_max_ptr,  # [N, C] float32
    chunk_argmax_ptr,  # [N, C] int32
    chunk_sum_ptr,  # [N, C] float32
    chunk_key_ptr,  # [N, C] float32
    chunk_key_index_ptr,  # [N, C] int32
    vocab,
    stride_logits,
    num_chunks,
    STORE_KEYS: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    step = tl.load(steps_ptr + row).to(tl.int64)
    row_logits = logits_ptr + row.to(tl.int64) * stride_logits
    row_keys = keys_ptr + row.to(tl.int64) * vocab
    best_x = tl.full([], float("-inf"), tl.float32)
    best_x_index = tl.full([], _INDEX_SENTINEL, tl.int32)
    best_key = tl.full([], float("-inf"), tl.float32)
    best_key_index = tl.full([], _INDEX_SENTINEL, tl.int32)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for block_start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
        offsets = block_start + tl.arange(0, BLOCK)
        mask = offsets < vocab
        if temperature <= 0:
            x = _scaled_logits(row_logits, offsets, mask, temperature, True)
            key = x
        else:
            x = _scaled_logits(row_logits, offsets, mask, temperature, False)
            gumbel = -tl.log(-tl.log(_uniform(seed, step, offsets)))
            key = tl.where(mask, x + gumbel, float("-inf"))
        if STORE_KEYS:
            tl.store(row_keys + offsets, key, mask=mask)
        block_max, block_index = _argmax_first(x, offsets)
        best_x, best_x_index = _merge_best(best_x, best_x_index, block_max, block_index)
        block_key, block_key_index = _argmax_first(key, offsets)
        best_key, best_key_index = _merge_best(best_key, best_key_index, block_key, block_key_index)
        safe_max = tl.where(block_max == float("-inf"), 0.0, block_max)
        m, s = _merge_sum_exp(m, s, block_max, tl.sum(tl.exp(x - safe_max), axis=0))
    out = row * num_chunks + chunk
    tl.store(chunk_max_ptr + out, best_x)
    tl.store(chunk_argmax_ptr + out, best_x_index)
    tl.store(chunk_sum_ptr + out, s)
    tl.store(chunk_key_ptr + out, best_key)
    tl.store(chunk_key_index_ptr + out, best_key_index)


@triton.jit
def _select_kernel(
    temperature_ptr,  # [N]
    top_k_ptr,  # [N] int (HAS_TOP_K)
    top_p_ptr,  # [N] float (HAS_TOP_P)
    min_p_ptr,  # [N] float (HAS_MIN_P)
    chunk_max_ptr,  # [N, C]
    chunk_argmax_ptr,
    chunk_sum_ptr,
    chunk_key_ptr,
    chunk_key_index_ptr,
    row_max_ptr,  # [N] float32 out: max of x
    row_sum_ptr,  # [N] float32 out: sum of exp(x - max)
    top_token_ptr,  # [N] int32 out: argmax of x
    needs_check_ptr,  # [N] int32 out: 1 if the candidate must pass the filters
    tokens_ptr,  # [N] int64 out: the candidate (final unless needs_check)
    vocab,
    num_chunks,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK_CHUNKS: tl.constexpr,
):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    mask = chunks < num_chunks
    base = row * num_chunks + chunks
    chunk_max = tl.load(chunk_max_ptr + base, mask=mask, other=float("-inf"))
    chunk_argmax = tl.load(chunk_argmax_ptr + base, mask=mask, other=_INDEX_SENTINEL)
    chunk_sum = tl.load(chunk_sum_ptr + base, mask=mask, other=0.0)
    chunk_key = tl.load(chunk_key_ptr + base, mask=mask, other=float("-inf"))
    chunk_key_index = tl.load(chunk_key_index_ptr + base, mask=mask, other=_INDEX_SENTINEL)
    m, top_token = _argmax_first(chunk_max, chunk_argmax)
    top_token = tl.where(top_token == _INDEX_SENTINEL, 0, top_token)  # an all -inf row
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(chunk_sum * tl.exp(chunk_max - safe_m), axis=0)
    _, candidate = _argmax_first(chunk_key, chunk_key_index)
    candidate = tl.where(candidate == _INDEX_SENTINEL, top_token, candidate)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    needs_check = _filters_active(row, top_k_ptr, top_p_ptr, min_p_ptr, vocab,
                                  HAS_TOP_K, HAS_TOP_P, HAS_MIN_P)  # fmt: skip
    needs_check = needs_check & (temperature > 0)
    tl.store(row_max_ptr + row, m)
    tl.store(row_sum_ptr + row, s)
    tl.store(top_token_ptr + row, top_token)
    tl.store(needs_check_ptr + row, needs_check.to(tl.int32))
    tl.store(tokens_ptr + row, candidate.to(tl.int64))


@triton.jit
def _filters_active(row, top_k_ptr, top_p_ptr, min_p_ptr, vocab, HAS_TOP_K: tl.constexpr,
                    HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr):  # fmt: skip
    active = row < 0  # a scalar False
    if HAS_TOP_K:
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        active = active | ((top_k > 0) & (top_k < vocab))
    if HAS_TOP_P:
        active = active | (tl.load(top_p_ptr + row).to(tl.float32) < 1.0)
    if HAS_MIN_P:
        active = active | (tl.load(min_p_ptr + row).to(tl.float32) > 0.0)
    return active


@triton.jit
def _scan_above(
    row_logits,
    row_keys,
    start,
    end,
    vocab,
    temperature,
    candidate_x,
    m,
    min_p,
    BLOCK: tl.constexpr,
):
    """Over tokens [start, end): how many have x above the candidate's, their probability mass
    (unnormalised, relative to exp(m)), and the best key among them that also passes min-p."""
    count = tl.full([], 0, tl.int32)
    mass = tl.full([], 0.0, tl.float32)
    next_key = tl.full([], float("-inf"), tl.float32)
    next_index = tl.full([], _INDEX_SENTINEL, tl.int32)
    for block_start in range(start, end, BLOCK):
        offsets = block_start + tl.arange(0, BLOCK)
        mask = (offsets < end) & (offsets < vocab)
        x = _scaled_logits(row_logits, offsets, mask, temperature, False)
        above = x > candidate_x
        weight = tl.exp(x - m)
        count += tl.sum(above.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(above, weight, 0.0), axis=0)
        key = tl.load(row_keys + offsets, mask=mask, other=float("-inf"))
        eligible = above & (weight >= min_p)
        block_key, block_index = _argmax_first(tl.where(eligible, key, float("-inf")), offsets)
        next_key, next_index = _merge_best(next_key, next_index, block_key, block_index)
    return count, mass, next_key, next_index


@triton.jit
def _row_filters(row, top_k_ptr, top_p_ptr, min_p_ptr, vocab, HAS_TOP_K: tl.constexpr,
                 HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr):  # fmt: skip
    """(top_k, top_p, min_p) with the 'off' values normalised: k = vocab, p = 2, min_p = 0."""
    top_k = vocab + 0
    top_p = tl.full([], 2.0, tl.float32)
    min_p = tl.full([], 0.0, tl.float32)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int32)
        top_k = tl.where((k > 0) & (k < vocab), k, vocab)
    if HAS_TOP_P:
        p = tl.load(top_p_ptr + row).to(tl.float32)
        top_p = tl.where(p < 1.0, p, 2.0)
    if HAS_MIN_P:
        min_p = tl.maximum(tl.load(min_p_ptr + row).to(tl.float32), 0.0)
    return top_k, top_p, min_p


@triton.jit
def _accepts(count, mass, candidate_weight, s, top_k, top_p, min_p):
    # top_p == 2.0 means off: no rounding of `mass` against `s` may reject then. A token with
    # nothing above it is always kept (top_p = 0 or min_p > 1 still leave the top token).
    passes = (count < top_k) & ((top_p > 1.0) | (mass < top_p * s)) & (candidate_weight >= min_p)
    return passes | (count == 0)


@triton.jit
def _check_kernel(
    logits_ptr,  # [N, V]
    keys_ptr,  # [N, V] float32
    temperature_ptr,
    min_p_ptr,
    row_max_ptr,
    needs_check_ptr,
    tokens_ptr,
    part_count_ptr,  # [N, C] int32
    part_mass_ptr,  # [N, C] float32
    part_key_ptr,  # [N, C] float32
    part_index_ptr,  # [N, C] int32
    vocab,
    stride_logits,
    num_chunks,
    HAS_MIN_P: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if tl.load(needs_check_ptr + row) == 0:
        return
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    row_logits = logits_ptr + row.to(tl.int64) * stride_logits
    row_keys = keys_ptr + row.to(tl.int64) * vocab
    candidate_x = _candidate_logit(row_logits, tl.load(tokens_ptr + row), temperature)
    m = tl.load(row_max_ptr + row)
    min_p = tl.full([], 0.0, tl.float32)
    if HAS_MIN_P:
        min_p = tl.maximum(tl.load(min_p_ptr + row).to(tl.float32), 0.0)
    start = chunk * CHUNK
    count, mass, next_key, next_index = _scan_above(
        row_logits, row_keys, start, start + CHUNK, vocab, temperature, candidate_x, m, min_p, BLOCK
    )
    out = row * num_chunks + chunk
    tl.store(part_count_ptr + out, count)
    tl.store(part_mass_ptr + out, mass)
    tl.store(part_key_ptr + out, next_key)
    tl.store(part_index_ptr + out, next_index)


@triton.jit
def _decide_kernel(
    logits_ptr,
    keys_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    row_max_ptr,
    row_sum_ptr,
    top_token_ptr,
    needs_check_ptr,
    tokens_ptr,  # [N] int64, in: candidate, out: the sampled token
    part_count_ptr,
    part_mass_ptr,
    part_key_ptr,
    part_index_ptr,
    vocab,
    stride_logits,
    num_chunks,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    MAX_ROUNDS: tl.constexpr,
    BLOCK_CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    if tl.load(needs_check_ptr + row) == 0:
        return
    top_k, top_p, min_p = _row_filters(row, top_k_ptr, top_p_ptr, min_p_ptr, vocab,
                                       HAS_TOP_K, HAS_TOP_P, HAS_MIN_P)  # fmt: skip
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    m = tl.load(row_max_ptr + row)
    s = tl.load(row_sum_ptr + row)
    row_logits = logits_ptr + row.to(tl.int64) * stride_logits
    row_keys = keys_ptr + row.to(tl.int64) * vocab
    # round one: merge the chunks' counts for the first candidate
    chunks = tl.arange(0, BLOCK_CHUNKS)
    mask = chunks < num_chunks
    base = row * num_chunks + chunks
    count = tl.sum(tl.load(part_count_ptr + base, mask=mask, other=0), axis=0)
    mass = tl.sum(tl.load(part_mass_ptr + base, mask=mask, other=0.0), axis=0)
    part_key = tl.load(part_key_ptr + base, mask=mask, other=float("-inf"))
    part_index = tl.load(part_index_ptr + base, mask=mask, other=_INDEX_SENTINEL)
    next_key, next_index = _argmax_first(part_key, part_index)
    candidate = tl.load(tokens_ptr + row).to(tl.int32)
    candidate_x = _candidate_logit(row_logits, candidate, temperature)
    accepted = _accepts(count, mass, tl.exp(candidate_x - m), s, top_k, top_p, min_p).to(tl.int32)
    rounds = tl.full([], 1, tl.int32)
    # later rounds (rare): the best key above the rejected candidate, checked in one serial pass
    while (accepted == 0) & (rounds < MAX_ROUNDS) & (next_key > float("-inf")):
        candidate = next_index
        candidate_x = _candidate_logit(row_logits, candidate, temperature)
        count, mass, next_key, next_index = _scan_above(
            row_logits, row_keys, 0, vocab, vocab, temperature, candidate_x, m, min_p, BLOCK
        )
        accepted = _accepts(count, mass, tl.exp(candidate_x - m), s, top_k, top_p, min_p)
        accepted = accepted.to(tl.int32)
        rounds += 1
    # the top token is always kept: the fallback after MAX_ROUNDS (or a degenerate row)
    candidate = tl.where(accepted != 0, candidate, tl.load(top_token_ptr + row))
    tl.store(tokens_ptr + row, candidate.to(tl.int64))


# ------------------------------------------------------------------------------------------------
# Wrapper
# ------------------------------------------------------------------------------------------------


def sample(
    logits: torch.Tensor,  # [N, V] float
    temperature: torch.Tensor,  # [N] float; <= 0: greedy
    seeds: torch.Tensor,  # [N] int64
    steps: torch.Tensor,  # [N] int64: changes between a request's draws
    top_k: torch.Tensor | None = None,  # [N] int; <= 0 or >= V: off
    top_p: torch.Tensor | None = None,  # [N] float; >= 1: off
    min_p: torch.Tensor | None = None,  # [N] float; <= 0: off
) -> torch.Tensor:
    """One token per row, [N] int64 on the logits' device; see the module docstring."""
    num_rows, vocab = _check_inputs(logits, temperature, seeds, steps, top_k, top_p, min_p)
    device = logits.device
    tokens = torch.empty(num_rows, dtype=torch.int64, device=device)
    if num_rows == 0:
        return tokens
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    chunk = CHUNK_SIZE
    block = min(1024, chunk)
    num_chunks = triton.cdiv(vocab, chunk)
    has_filters = top_k is not None or top_p is not None or min_p is not None
    # [N, C] per-chunk partial results
    chunk_max, chunk_sum, chunk_key = (_empty(num_rows, num_chunks, torch.float32, device)
                                       for _ in range(3))  # fmt: skip
    chunk_argmax, chunk_key_index = (_empty(num_rows, num_chunks, torch.int32, device)
                                     for _ in range(2))  # fmt: skip
    # [N, V] keys x + G, re-read by the filter passes
    keys = _empty(num_rows, vocab, torch.float32, device) if has_filters else chunk_key
    _chunk_kernel[(num_rows, num_chunks)](
        logits, temperature, seeds, steps, keys, chunk_max, chunk_argmax, chunk_sum, chunk_key,
        chunk_key_index, vocab, logits.stride(0), num_chunks, STORE_KEYS=has_filters,
        CHUNK=chunk, BLOCK=block, num_warps=8,
    )  # fmt: skip
    # [N] per-row state passed between the kernels
    row_max = torch.empty(num_rows, dtype=torch.float32, device=device)
    row_sum = torch.empty(num_rows, dtype=torch.float32, device=device)
    top_token = torch.empty(num_rows, dtype=torch.int32, device=device)
    needs_check = torch.empty(num_rows, dtype=torch.int32, device=device)
    flags = dict(HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
                 HAS_MIN_P=min_p is not None)  # fmt: skip
    top_k_arg = top_k if top_k is not None else temperature
    top_p_arg = top_p if top_p is not None else temperature
    min_p_arg = min_p if min_p is not None else temperature
    block_chunks = triton.next_power_of_2(num_chunks)
    _select_kernel[(num_rows,)](
        temperature, top_k_arg, top_p_arg, min_p_arg, chunk_max, chunk_argmax, chunk_sum,
        chunk_key, chunk_key_index, row_max, row_sum, top_token, needs_check, tokens, vocab,
        num_chunks, BLOCK_CHUNKS=block_chunks, **flags, num_warps=1,
    )  # fmt: skip
    if not has_filters:
        return tokens
    # the chunk buffers are free again: reuse them for the first check's partial results
    _check_kernel[(num_rows, num_chunks)](
        logits, keys, temperature, min_p_arg, row_max, needs_check, tokens, chunk_argmax,
        chunk_sum, chunk_key, chunk_key_index, vocab, logits.stride(0), num_chunks,
        HAS_MIN_P=min_p is not None, CHUNK=chunk, BLOCK=block, num_warps=8,
    )  # fmt: skip
    _decide_kernel[(num_rows,)](
        logits, keys, temperature, top_k_arg, top_p_arg, min_p_arg, row_max, row_sum, top_token,
        needs_check, tokens, chunk_argmax, chunk_sum, chunk_key, chunk_key_index, vocab,
        logits.stride(0), num_chunks, **flags, MAX_ROUNDS=MAX_ROUNDS, BLOCK_CHUNKS=block_chunks,
        BLOCK=block, num_warps=8,
    )  # fmt: skip
    return tokens


def _empty(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty((rows, cols), dtype=dtype, device=device)


def _check_inputs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> tuple[int, int]:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got {tuple(logits.shape)}")
    num_rows, vocab = logits.shape
    named = dict(temperature=temperature, seeds=seeds, steps=steps, top_k=top_k, top_p=top_p,
                 min_p=min_p)  # fmt: skip
    for name, t in named.items():
        if t is None:
            continue
        if t.shape != (num_rows,) or t.device != logits.device:
            raise ValueError(
                f"{name} must be a [{num_rows}] tensor on {logits.device}, got "
                f"{tuple(t.shape)} on {t.device}"
            )
    for name in ("seeds", "steps"):
        if named[name].dtype != torch.int64:
            raise ValueError(f"{name} must be int64, got {named[name].dtype}")
    if vocab >= _INDEX_SENTINEL.value:
        raise ValueError(f"vocab {vocab} is too large")
    return num_rows, vocab


# ------------------------------------------------------------------------------------------------
# The torch twin
# ------------------------------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF


def philox_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N] seeds, [N] steps -> [N, V] float32 uniforms in (0, 1), bit-identical to the kernel's."""
    c0 = torch.arange(vocab, dtype=torch.int64, device=seeds.device)[None, :]
    steps = steps[:, None]
    seeds = seeds[:, None]
    words = philox4x32(
        (c0, steps & _MASK32, (steps >> 32) & _MASK32, torch.zeros_like(c0)),
        (seeds & _MASK32, (seeds >> 32) & _MASK32),
    )
    return ((words[0] >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)


def philox4x32(
    counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 on int64 tensors holding 32-bit words (broadcast together)."""
    c0, c1, c2, c3 = torch.broadcast_tensors(*counter, *key)[:4]
    k0, k1 = key
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mul_hi_lo(c0, PHILOX_M0)
        hi1, lo1 = _mul_hi_lo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def _mul_hi_lo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for 32-bit a, b, in int64 without overflow (16-bit limbs)."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    low = a_lo * b_lo
    middle = a_hi * b_lo + a_lo * b_hi
    high = a_hi * b_hi + ((middle + (low >> 16)) >> 16)
    return high & _MASK32, (((middle & 0xFFFF) << 16) + low) & _MASK32


def sample_reference(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-torch twin of `sample` (same definition, same random numbers), [N] int64."""
    num_rows, vocab = _check_inputs(logits, temperature, seeds, steps, top_k, top_p, min_p)
    raw = logits.float()
    raw = torch.where(torch.isnan(raw), float("-inf"), raw)
    greedy = temperature <= 0
    safe_temperature = torch.where(greedy, 1.0, temperature.float())
    x = torch.where(greedy[:, None], raw, raw / safe_temperature[:, None])
    keys = x - torch.log(-torch.log(philox_uniform(seeds, steps, vocab)))  # x + Gumbel noise
    kept = _kept(x, top_k, top_p, min_p, vocab)
    drawn = torch.where(kept, keys, float("-inf")).argmax(dim=-1)
    return torch.where(greedy, raw.argmax(dim=-1), drawn)


def kept_tokens(
    logits: torch.Tensor,  # [N, V]
    temperature: torch.Tensor,  # [N]
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[N, V] bool: the tokens a non-greedy row may draw (the filters of the module docstring)."""
    raw = logits.float()
    raw = torch.where(torch.isnan(raw), float("-inf"), raw)
    safe_temperature = torch.where(temperature <= 0, 1.0, temperature.float())
    return _kept(raw / safe_temperature[:, None], top_k, top_p, min_p, logits.shape[-1])


def _kept(
    x: torch.Tensor,  # [N, V] scaled logits
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    vocab: int,
) -> torch.Tensor:
    """[N, V] bool: the tokens that pass all three filters (see the module docstring)."""
    if top_k is None and top_p is None and min_p is None:
        return torch.ones_like(x, dtype=torch.bool)
    m = x.max(dim=-1, keepdim=True).values
    weight = torch.exp(x - torch.where(m == float("-inf"), 0.0, m))  # p * sum, p_max -> 1
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    descending = (-sorted_x).contiguous()
    above = torch.searchsorted(descending, descending, side="left")  # [N, V] count strictly above
    sorted_weight = weight.gather(-1, order)
    mass_before = sorted_weight.cumsum(dim=-1) - sorted_weight
    mass_above = mass_before.gather(-1, above)
    kept_sorted = torch.ones_like(sorted_x, dtype=torch.bool)
    if min_p is not None:
        kept_sorted &= sorted_weight >= min_p.float().clamp(min=0)[:, None]
    if top_k is not None:
        k = top_k.long()
        k = torch.where((k > 0) & (k < vocab), k, vocab)
        kept_sorted &= above < k[:, None]
    if top_p is not None:
        p = top_p.float()[:, None]
        kept_sorted &= (p >= 1.0) | (mass_above < p * weight.sum(dim=-1, keepdim=True))
    kept_sorted |= above == 0  # the top token always stays
    return torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
