"""GPU sampling (gossamer/kernels/sampling.py): the kernels against their torch twin, token for token,
and the twin against the definition (exclusion by the filters, frequencies, the Philox spec).

The interpreter runs the kernels slowly (tens of ms per program), so kernel tests use a few rows and a
small CHUNK_SIZE (several chunks per row, so the cross-chunk merges are exercised); statistics run on
the twin, which the kernel equals draw for draw. GPU tests (`-m gpu`) use the real vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from gossamer.kernels.sampling import kept_tokens, philox4x32, philox_uniform, sample_reference
from tests.kernels.interpreted import DEVICE, ON_GPU, kernel_fixture

_kernels = kernel_fixture("sampling")


@pytest.fixture
def sampling(_kernels, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_kernels, "CHUNK_SIZE", 32)  # several chunks per row on tiny vocabularies
    return _kernels


def _params(n: int, device: str = DEVICE, **columns):
    """Per-row tensors: temperature (float), seeds/steps (int64), optional filters."""
    out = dict(
        temperature=torch.tensor(columns.pop("temperature"), dtype=torch.float32, device=device),
        seeds=torch.tensor(columns.pop("seeds", [11 * i - 3 for i in range(n)]), device=device),
        steps=torch.tensor(columns.pop("steps", [0] * n), device=device),
    )
    dtypes = dict(top_k=torch.int32, top_p=torch.float32, min_p=torch.float32)
    for name, values in columns.items():
        out[name] = torch.tensor(values, dtype=dtypes[name], device=device)
    return out


def _assert_same_draws(ours: torch.Tensor, ref: torch.Tensor, logits, params) -> None:
    """Equal token for token; on a GPU (approximate log/division) a row may differ only where two
    kept tokens' keys tie to within float rounding."""
    if not ON_GPU:
        assert torch.equal(ours.cpu(), ref.cpu())
        return
    temperature = params["temperature"]
    x = logits.float() / torch.where(temperature > 0, temperature, 1.0)[:, None]
    keys = x - torch.log(-torch.log(philox_uniform(params["seeds"], params["steps"], x.shape[1])))
    rows = torch.nonzero(ours != ref).flatten().tolist()
    for row in rows:
        assert temperature[row] > 0, "greedy rows must match exactly"
        gap = (keys[row, ours[row]] - keys[row, ref[row]]).abs()
        assert gap <= 1e-4 * keys[row].abs().max(), f"row {row}: {ours[row]} vs {ref[row]}"


# ------------------------------------------------------------------------------------------------
# kernels == twin
# ------------------------------------------------------------------------------------------------


def test_kernel_equals_twin_on_a_mixed_batch(sampling):
    rows, vocab = 8, 96
    logits = 2 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    logits = logits.to(DEVICE)
    params = _params(
        rows,
        temperature=[0.0, 1.0, 0.7, 1.3, 100.0, 1.0, 2.0, 0.5],
        top_k=[0, 0, 5, 0, 1, 20, 96, 3],  # row 4: flat + top-1 forces several rejection rounds
        top_p=[1.0, 1.0, 1.0, 0.6, 1.0, 0.3, 1.0, 0.9],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.05],
        steps=[0, 1, 2, 3, 4, 5, 6, 2**40 + 7],
    )
    ours = sampling.sample(logits, **params)
    assert ours.dtype == torch.int64 and ours.shape == (rows,) and ours.device == logits.device
    _assert_same_draws(ours, sample_reference(logits, **params), logits, params)


def test_kernel_equals_twin_without_filters_and_with_float16_logits(sampling):
    rows, vocab = 4, 70
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)).half()
    logits = logits.to(DEVICE)
    params = _params(rows, temperature=[1.0, 0.3, 0.0, 3.0], seeds=[0, -1, 2**62, 5])
    ours = sampling.sample(logits, **params)
    _assert_same_draws(ours, sample_reference(logits, **params), logits, params)


def test_greedy_is_argmax_taking_the_first_index_on_ties(sampling):
    logits = torch.randn(3, 80, generator=torch.Generator().manual_seed(2))
    logits[0, [7, 50, 75]] = 9.0  # ties across chunks: the first one wins
    logits[1, 40:] = float("-inf")
    logits[1, 3] = float("nan")  # NaN counts as -inf
    logits = logits.to(DEVICE)
    params = _params(3, temperature=[0.0, -1.0, 0.0], top_k=[1, 2, 0], top_p=[0.5, 1.0, 0.1])
    ours = sampling.sample(logits, **params)
    expected = torch.where(torch.isnan(logits), float("-inf"), logits).argmax(dim=-1)
    assert ours.tolist() == expected.tolist()
    assert ours[0] == 7


def test_a_seeded_row_draws_the_same_token_at_any_batch_position(sampling):
    vocab = 64
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, vocab, generator=g).to(DEVICE)
    columns = dict(temperature=[1.0, 0.8, 1.2, 1.0], seeds=[42, 7, 8, 9], steps=[5, 0, 1, 2],
                   top_k=[10, 0, 4, 0], top_p=[0.9, 1.0, 0.5, 0.7])  # fmt: skip
    batch = sampling.sample(logits, **_params(4, **columns))
    alone = sampling.sample(
        logits[:1], **_params(1, **{name: values[:1] for name, values in columns.items()})
    )
    order = [2, 3, 0, 1]  # row 0 moves to position 2
    permuted = sampling.sample(
        logits[order], **_params(4, **{n: [v[i] for i in order] for n, v in columns.items()})
    )
    assert alone[0] == batch[0] == permuted[2]
    assert permuted.tolist() == batch[order].tolist()


def test_kernel_draws_only_kept_tokens(sampling):
    rows, vocab = 6, 48
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    params = _params(rows, temperature=[2.0] * rows, steps=list(range(rows)),
                     top_k=[2, 0, 0, 3, 0, 1], top_p=[1.0, 0.2, 1.0, 0.5, 1.0, 1.0],
                     min_p=[0.0, 0.0, 0.5, 0.0, 0.9, 0.0])  # fmt: skip
    tokens = sampling.sample(logits, **params).cpu()
    allowed = _kept_by_sorting(logits.cpu(), {k: v.cpu() for k, v in params.items()})
    assert allowed[torch.arange(rows), tokens].all()


def test_rejects_bad_inputs(sampling):
    logits = torch.randn(2, 10, device=DEVICE)
    good = _params(2, temperature=[1.0, 1.0])
    with pytest.raises(ValueError, match="seeds must be int64"):
        sampling.sample(logits, **(good | dict(seeds=good["seeds"].int())))
    with pytest.raises(ValueError, match="top_p must be a \\[2\\] tensor"):
        sampling.sample(logits, **good, top_p=torch.ones(3, device=DEVICE))


# ------------------------------------------------------------------------------------------------
# the twin against the definition
# ------------------------------------------------------------------------------------------------


def test_philox_matches_the_random123_known_answers():
    def words(counter, key):
        out = philox4x32(tuple(torch.tensor([c]) for c in counter),
                         tuple(torch.tensor([k]) for k in key))  # fmt: skip
        return [int(w) for w in out]

    assert words([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 0xFFFFFFFF
    assert words([ones] * 4, [ones] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi_counter = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]
    assert words(pi_counter, [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1,
    ]  # fmt: skip
    u = philox_uniform(torch.tensor([0]), torch.tensor([0]), 1)
    assert u.item() == ((0x6627E8D5 >> 9) + 0.5) / 2**23


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    expected = probs.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square critical values at p = 0.001 for 5 and 2 degrees of freedom
CHI2_CRITICAL = {5: 20.52, 2: 13.82}


def _repeated(logits_row: torch.Tensor, draws: int, device=DEVICE, **filters):
    """One row repeated `draws` times with one seed and steps 0..draws-1 (a request's draws)."""
    logits = logits_row.to(device).expand(draws, -1).contiguous()
    params = dict(temperature=torch.full((draws,), 0.8, device=device),
                  seeds=torch.full((draws,), 1234, dtype=torch.int64, device=device),
                  steps=torch.arange(draws, device=device))  # fmt: skip
    for name, value in filters.items():
        dtype = torch.int32 if name == "top_k" else torch.float32
        params[name] = torch.full((draws,), value, dtype=dtype, device=device)
    return logits, params


LOGITS6 = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.5]])


def test_twin_frequencies_follow_the_tempered_softmax():
    logits, params = _repeated(LOGITS6[0], 20000, device="cpu")
    tokens = sample_reference(logits, **params)
    probs = torch.softmax(LOGITS6[0] / 0.8, dim=-1)
    assert _chi_square(tokens, probs) < CHI2_CRITICAL[5]


def test_twin_frequencies_after_top_k_follow_the_renormalised_softmax():
    logits, params = _repeated(LOGITS6[0], 20000, device="cpu", top_k=3)
    tokens = sample_reference(logits, **params)
    assert set(tokens.tolist()) == {0, 1, 3}
    probs = torch.softmax(LOGITS6[0, [0, 1, 3]] / 0.8, dim=-1)
    remap = torch.zeros(6, dtype=torch.long)
    remap[torch.tensor([0, 1, 3])] = torch.arange(3)
    assert _chi_square(remap[tokens], probs) < CHI2_CRITICAL[2]


def test_twin_steps_give_fresh_draws_and_seeds_differ():
    logits, params = _repeated(torch.zeros(50), 200, device="cpu")
    tokens = sample_reference(logits, **params)
    assert len(set(tokens.tolist())) > 40  # uniform over 50: repeats are rare, not systematic
    other = sample_reference(logits, **(params | dict(seeds=params["seeds"] + 1)))
    assert (other != tokens).float().mean() > 0.8


def _kept_by_sorting(logits: torch.Tensor, params: dict) -> torch.Tensor:
    """An independent statement of the filters: rank in the sorted order, cumulative mass."""
    temperature = params["temperature"]
    probs = torch.softmax(logits.float() / temperature[:, None], dim=-1)
    rows, vocab = probs.shape
    kept = torch.zeros(rows, vocab, dtype=torch.bool)
    for row in range(rows):
        order = probs[row].argsort(descending=True)
        p_sorted = probs[row, order]
        keep = torch.ones(vocab, dtype=torch.bool)
        k = int(params["top_k"][row]) if "top_k" in params else 0
        if 0 < k < vocab:
            keep &= torch.arange(vocab) < k
        p = float(params["top_p"][row]) if "top_p" in params else 1.0
        if p < 1.0:
            keep &= (p_sorted.cumsum(0) - p_sorted) < p
        min_p = float(params["min_p"][row]) if "min_p" in params else 0.0
        keep &= p_sorted >= min_p * p_sorted[0]
        keep[0] = True
        kept[row, order[keep]] = True
    return kept


@pytest.mark.parametrize("filters", [dict(top_k=4), dict(top_p=0.5), dict(min_p=0.3),
                                     dict(top_k=6, top_p=0.7, min_p=0.1)])  # fmt: skip
def test_twin_never_draws_a_filtered_token(filters):
    g = torch.Generator().manual_seed(5)
    logits = 1.5 * torch.randn(200, 30, generator=g)
    params = dict(temperature=torch.full((200,), 1.1), seeds=torch.arange(200) * 977,
                  steps=torch.zeros(200, dtype=torch.int64))  # fmt: skip
    for name, value in filters.items():
        dtype = torch.int32 if name == "top_k" else torch.float32
        params[name] = torch.full((200,), value, dtype=dtype)
    tokens = sample_reference(logits, **params)
    allowed = _kept_by_sorting(logits, params)
    assert allowed[torch.arange(200), tokens].all()
    twin_kept = kept_tokens(logits, params["temperature"],
                            *(params.get(n) for n in ("top_k", "top_p", "min_p")))  # fmt: skip
    assert torch.equal(twin_kept, allowed)  # no ties in random logits: the two agree exactly
    assert (allowed.sum(-1) > 1).any()  # the filters left a real choice somewhere


# ------------------------------------------------------------------------------------------------
# GPU: the real vocabulary
# ------------------------------------------------------------------------------------------------

VOCAB = 201088


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_gpu_real_vocabulary_matches_twin(rows):
    from gossamer.kernels import sampling as compiled

    g = torch.Generator().manual_seed(rows)
    logits = (4 * torch.randn(rows, VOCAB, generator=g)).cuda()
    pattern = dict(temperature=[0.0, 1.0, 0.7, 1.0], top_k=[0, 0, 50, 1],
                   top_p=[1.0, 0.9, 1.0, 0.95], min_p=[0.0, 0.0, 0.05, 0.0])  # fmt: skip
    columns = {name: (values * rows)[:rows] for name, values in pattern.items()}
    params = _params(rows, device="cuda", steps=list(range(rows)), **columns)
    ours = compiled.sample(logits, **params)
    _assert_same_draws(ours, sample_reference(logits, **params), logits, params)
    kept = kept_tokens(logits, params["temperature"], params["top_k"], params["top_p"],
                       params["min_p"])  # fmt: skip
    greedy = params["temperature"] <= 0
    assert (kept[torch.arange(rows, device="cuda"), ours] | greedy).all()
    assert torch.equal(ours[greedy], logits[greedy].argmax(-1))
    again = compiled.sample(logits.flip(0), **{n: t.flip(0) for n, t in params.items()})
    assert torch.equal(again.flip(0), ours)  # batch position does not matter


@pytest.mark.gpu
@pytest.mark.parametrize("filters", [{}, dict(top_k=3)])
def test_gpu_kernel_frequencies(filters):
    from gossamer.kernels import sampling as compiled

    logits, params = _repeated(LOGITS6[0], 20000, device="cuda", **filters)
    tokens = compiled.sample(logits, **params).cpu()
    if filters:
        remap = torch.zeros(6, dtype=torch.long)
        remap[torch.tensor([0, 1, 3])] = torch.arange(3)
        probs = torch.softmax(LOGITS6[0, [0, 1, 3]] / 0.8, dim=-1)
        assert _chi_square(remap[tokens], probs) < CHI2_CRITICAL[2]
    else:
        assert _chi_square(tokens, torch.softmax(LOGITS6[0] / 0.8, dim=-1)) < CHI2_CRITICAL[5]
